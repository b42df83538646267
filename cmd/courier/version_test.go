package main

import (
	"encoding/json"
	"runtime"
	"strings"
	"testing"
)

// TestCLIVersion: `courier --version` prints the version from the
// module's build information, and the management API's overview (which
// the dashboard shows) gives the same.
func TestCLIVersion(t *testing.T) {
	out := cliOK(t, "--version")
	version, rest, ok := strings.Cut(strings.TrimPrefix(out, "courier "), " ")
	if !strings.HasPrefix(out, "courier ") || !ok || version == "" ||
		rest != "("+runtime.Version()+" "+runtime.GOOS+"/"+runtime.GOARCH+")\n" {
		t.Fatalf("--version printed %q", out)
	}
	_, api := adminServer(t)
	var o struct {
		Version string `json:"courier_version"`
	}
	body := cliOK(t, "overview", "--json", "--api", api)
	if err := json.Unmarshal([]byte(body), &o); err != nil || o.Version != version {
		t.Errorf("overview's courier_version %q (%v), --version %q", o.Version, err, version)
	}
	if table := cliOK(t, "overview", "--api", api); !strings.Contains(table, "(courier "+version+", ") {
		t.Errorf("overview table lacks the version %q:\n%s", version, table)
	}
}
