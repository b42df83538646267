package admin_test

import (
	"bytes"
	"compress/gzip"
	"io"
	"net/http"
	"runtime"
	"strings"
	"testing"
	"time"
)

func TestPprof(t *testing.T) {
	h := start(t)
	code, _, body := h.do("GET", "/debug/pprof/", "")
	if code != 200 || !bytes.Contains(body, []byte("goroutine")) {
		t.Fatalf("/debug/pprof/: %d", code)
	}
	for _, path := range []string{"/debug/pprof/heap?debug=1", "/debug/pprof/goroutine?debug=2", "/debug/pprof/allocs?debug=1", "/debug/pprof/cmdline"} {
		if code, _, body := h.do("GET", path, ""); code != 200 || len(body) == 0 {
			t.Errorf("GET %s: %d, %d bytes", path, code, len(body))
		}
	}
	// A CPU profile is a gzipped protocol buffer.
	code, _, body = h.do("GET", "/debug/pprof/profile?seconds=1", "")
	if code != 200 {
		t.Fatalf("CPU profile: %d %s", code, body)
	}
	if zr, err := gzip.NewReader(bytes.NewReader(body)); err != nil {
		t.Errorf("CPU profile is not gzipped: %v", err)
	} else if _, err := io.ReadAll(zr); err != nil {
		t.Errorf("CPU profile: %v", err)
	}

	if f := runtime.SetMutexProfileFraction(-1); f != 0 {
		t.Skipf("mutex profiling was on before the test (fraction %d)", f)
	}
	for _, kind := range []string{"mutex", "block"} {
		// Off by default, and asking without seconds says how to turn it on.
		code, _, body := h.do("GET", "/debug/pprof/"+kind, "")
		if code != 400 || !strings.Contains(string(body), "?seconds=") {
			t.Errorf("%s without seconds: %d %s", kind, code, body)
		}
		for _, q := range []string{"?seconds=x", "?seconds=0", "?seconds=1&rate=-3"} {
			if code, _, _ := h.do("GET", "/debug/pprof/"+kind+q, ""); code != 400 {
				t.Errorf("%s%s: %d, want 400", kind, q, code)
			}
		}
	}

	// With seconds, mutex profiling is on while the profile records, and
	// off again after.
	during := make(chan int, 1)
	go func() {
		time.Sleep(300 * time.Millisecond) // inside the one-second window
		during <- runtime.SetMutexProfileFraction(-1)
	}()
	code, hdr, body := h.do("GET", "/debug/pprof/mutex?seconds=1&rate=7", "")
	if code != 200 || hdr.Get("Content-Type") != "application/octet-stream" || len(body) == 0 {
		t.Errorf("mutex profile: %d %q %d bytes", code, hdr.Get("Content-Type"), len(body))
	}
	if f := <-during; f != 7 {
		t.Errorf("mutex fraction %d while recording, want 7", f)
	}
	if f := runtime.SetMutexProfileFraction(-1); f != 0 {
		t.Errorf("mutex fraction %d after the profile, want 0", f)
	}
	if code, _, _ := h.do("GET", "/debug/pprof/block?seconds=1", ""); code != http.StatusOK {
		t.Errorf("block profile: %d", code)
	}
	// Once recorded, the cumulative profile is served.
	if code, _, _ := h.do("GET", "/debug/pprof/mutex?debug=1", ""); code != 200 {
		t.Errorf("mutex profile after recording: %d", code)
	}
}
