package testutil

import (
	"os"
	"os/exec"
	"testing"
)

// Chromium returns the path of Debian's chromium for a browser test.
// Without it the test skips, unless CI=true, where it fails: CI must
// install it (.ci/run does).
func Chromium(t testing.TB) string {
	t.Helper()
	for _, name := range []string{"/usr/bin/chromium", "chromium", "chromium-browser"} {
		if p, err := exec.LookPath(name); err == nil {
			return p
		}
	}
	if os.Getenv("CI") == "true" {
		t.Fatal("chromium is not installed and CI=true: install it with `apt-get install -y chromium` (.ci/run does)")
	}
	t.Skip("chromium is not installed (apt-get install -y chromium): the browser test is skipped")
	return ""
}
