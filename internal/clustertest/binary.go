package clustertest

import (
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"sync"
	"testing"
)

var built struct {
	once sync.Once
	dir  string
	bin  string
	err  error
}

// EnvBinary names a courier binary to test instead of building one:
// COURIER_CHAOS_BIN=/path/to/courier, to run the fault tests against
// another build.
const EnvBinary = "COURIER_CHAOS_BIN"

// Binary builds the courier binary once per test process and returns
// its path ([EnvBinary] overrides it). [Main] removes it when the tests
// end.
func Binary() (string, error) {
	if b := os.Getenv(EnvBinary); b != "" {
		return b, nil
	}
	built.once.Do(func() {
		built.dir, built.err = os.MkdirTemp("", "courier-clustertest-")
		if built.err != nil {
			return
		}
		built.bin = filepath.Join(built.dir, "courier")
		gobin, err := exec.LookPath("go")
		if err != nil {
			gobin = filepath.Join(os.Getenv("GOROOT"), "bin", "go")
		}
		cmd := exec.Command(gobin, "build", "-o", built.bin, "github.com/courier-mq/courier/cmd/courier")
		if out, err := cmd.CombinedOutput(); err != nil {
			built.err = fmt.Errorf("clustertest: go build: %w\n%s", err, out)
		}
	})
	return built.bin, built.err
}

// Main runs a test binary's tests and then removes the courier binary
// [Binary] built: call it from TestMain as os.Exit(clustertest.Main(m)).
func Main(m *testing.M) int {
	code := m.Run()
	if built.dir != "" {
		os.RemoveAll(built.dir)
	}
	return code
}
