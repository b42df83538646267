package node_test

import (
	"encoding/binary"
	"encoding/json"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/courier-mq/courier"
	"github.com/courier-mq/courier/internal/testutil"
	"github.com/courier-mq/courier/node"
)

// TestStartReportsDamage: a byte changed in the middle of the newest
// segment after a clean shutdown (so before the checkpoint, which a
// start does not replay) is reported after the next start without any
// task being read: in the log, in /api/overview (store.damaged_records,
// a "damage" alarm) and in the metrics, with the count.
func TestStartReportsDamage(t *testing.T) {
	dir := t.TempDir()
	ctx := testutil.Context(t, time.Minute)
	n, err := node.Start(node.Config{DataDir: dir, Log: quiet()})
	if err != nil {
		t.Fatal(err)
	}
	jobs, err := n.Connect().Tasks(ctx, "jobs")
	if err != nil {
		t.Fatal(err)
	}
	body := []byte(strings.Repeat("payload ", 128))
	for range 200 {
		if _, err := jobs.Submit(ctx, courier.Task{Body: body}); err != nil {
			t.Fatal(err)
		}
	}
	n.Close()

	size := flipPayloadByte(t, filepath.Join(dir, "store"))

	var logs logBuffer
	n, err = node.Start(node.Config{DataDir: dir, Log: logs.logger(), HTTP: "127.0.0.1:0"})
	if err != nil {
		t.Fatal(err)
	}
	defer n.Close()
	var ov struct {
		Store struct {
			DamagedRecords int64  `json:"damaged_records"`
			DamagedBytes   int64  `json:"damaged_bytes"`
			Scrub          string `json:"scrub"`
			ScrubBytes     int64  `json:"scrub_bytes"`
			ScrubTotal     int64  `json:"scrub_total"`
		} `json:"store"`
		Alarms []struct{ Kind, Message string } `json:"alarms"`
	}
	testutil.WaitForf(t, 20*time.Second, func() bool {
		if err := json.Unmarshal([]byte(httpGet(t, n.HTTPURL()+"/api/overview")), &ov); err != nil {
			t.Fatal(err)
		}
		return ov.Store.Scrub == "done"
	}, "the background check is not done: %+v", ov.Store)
	if ov.Store.DamagedRecords != 1 || ov.Store.DamagedBytes != size || ov.Store.ScrubBytes != ov.Store.ScrubTotal {
		t.Errorf("overview store: %+v; want 1 damaged record", ov.Store)
	}
	if len(ov.Alarms) != 1 || ov.Alarms[0].Kind != "damage" || !strings.Contains(ov.Alarms[0].Message, "1 damaged record") {
		t.Errorf("alarms: %+v", ov.Alarms)
	}
	if m := httpGet(t, n.HTTPURL()+"/metrics"); !strings.Contains(m, "\ncourier_store_damaged_records 1\n") || !strings.Contains(m, `courier_alarm{kind="damage"} 1`) {
		t.Errorf("metrics lack the damage:\n%s", grepLines(m, "damage"))
	}
	l := logs.String()
	if !strings.Contains(l, "found a damaged record") || !strings.Contains(l, "checksum mismatch") || !strings.Contains(l, "damaged_records=1") {
		t.Errorf("the log does not report the damage with its count:\n%s", l)
	}
	t.Logf("log:\n%s", grepLines(l, "store"))
}

// flipPayloadByte changes one byte in the middle of the payload of the
// record at the middle of the newest segment of the store in dir, and
// returns the record's size.
func flipPayloadByte(t *testing.T, dir string) int64 {
	t.Helper()
	segs, err := filepath.Glob(filepath.Join(dir, "*.seg"))
	if err != nil || len(segs) == 0 {
		t.Fatalf("no segment in %s: %v", dir, err)
	}
	path := segs[len(segs)-1]
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	// Records: crc u32, len u32, queue u32, kind u8, 3 zero bytes,
	// payload; after a 16-byte segment header (docs/storage-format.md).
	mid := int64(len(b) / 2)
	for off := int64(16); off+16 <= int64(len(b)); {
		n := int64(binary.LittleEndian.Uint32(b[off+4:]))
		if off+16+n > mid {
			b[off+16+n/2] ^= 0x40
			if err := os.WriteFile(path, b, 0o600); err != nil {
				t.Fatal(err)
			}
			return 16 + n
		}
		off += 16 + n
	}
	t.Fatalf("no record across the middle of %s", path)
	return 0
}

func httpGet(t *testing.T, url string) string {
	t.Helper()
	resp, err := http.Get(url)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatal(err)
	}
	return string(b)
}

func grepLines(s, want string) string {
	var out []string
	for _, l := range strings.Split(s, "\n") {
		if strings.Contains(l, want) {
			out = append(out, l)
		}
	}
	return strings.Join(out, "\n")
}
