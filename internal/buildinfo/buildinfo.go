// Package buildinfo tells which Courier this is, from the module's build
// information: the CLI's --version, the management API's overview and
// the dashboard all show the same string.
package buildinfo

import (
	"runtime"
	"runtime/debug"
)

// Version returns the Courier version of the running binary: the main
// module's version when it was built from a tagged module (go install
// ...@v1.2.3), else "devel" followed by the VCS revision when the build
// recorded one ("devel+0123456789ab", "-dirty" when the tree had
// changes), else "devel".
func Version() string {
	bi, ok := debug.ReadBuildInfo()
	if !ok {
		return "devel"
	}
	return FromBuildInfo(bi)
}

// FromBuildInfo is [Version] for the given build information.
func FromBuildInfo(bi *debug.BuildInfo) string {
	if v := bi.Main.Version; v != "" && v != "(devel)" {
		return v
	}
	var rev string
	var dirty bool
	for _, s := range bi.Settings {
		switch s.Key {
		case "vcs.revision":
			rev = s.Value
		case "vcs.modified":
			dirty = s.Value == "true"
		}
	}
	if len(rev) < 12 {
		return "devel"
	}
	v := "devel+" + rev[:12]
	if dirty {
		v += "-dirty"
	}
	return v
}

// Long returns the version with the Go version and platform, as
// `courier --version` prints it: "devel+0123456789ab (go1.26.8 linux/amd64)".
func Long() string {
	return Version() + " (" + runtime.Version() + " " + runtime.GOOS + "/" + runtime.GOARCH + ")"
}
