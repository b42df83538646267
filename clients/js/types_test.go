package js

import (
	"context"
	"os"
	"os/exec"
	"strings"
	"testing"
	"time"
)

// TestTypes compiles types/check.ts, which uses every export of
// index.d.ts as docs/js.md shows it, with `tsc --noEmit --strict`:
// definitions that do not fit what the documentation shows (or that do
// not compile) fail it. It skips without tsc (Debian's node-typescript),
// and fails under CI=true, where .ci/run installs it.
func TestTypes(t *testing.T) {
	bin, err := exec.LookPath("tsc")
	if err != nil {
		if os.Getenv("CI") == "true" {
			t.Fatal("tsc is not installed and CI=true: install it with `apt-get install -y node-typescript` (.ci/run does)")
		}
		t.Skip("tsc is not installed (apt-get install -y node-typescript): index.d.ts is not checked")
	}
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	args := []string{"--noEmit", "--strict", "-p", "types"}
	out, err := exec.CommandContext(ctx, bin, args...).CombinedOutput()
	if err != nil {
		t.Fatalf("tsc %s: %v\n%s", strings.Join(args, " "), err, out)
	}
}
