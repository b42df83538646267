package buildinfo

import (
	"runtime/debug"
	"testing"
)

func TestFromBuildInfo(t *testing.T) {
	rev := debug.BuildSetting{Key: "vcs.revision", Value: "0123456789abcdef0123"}
	for _, tc := range []struct {
		name string
		bi   debug.BuildInfo
		want string
	}{
		{"Tagged", debug.BuildInfo{Main: debug.Module{Version: "v1.4.0"}, Settings: []debug.BuildSetting{rev}}, "v1.4.0"},
		{"Pseudo", debug.BuildInfo{Main: debug.Module{Version: "v0.0.0-20261201150000-0123456789ab"}}, "v0.0.0-20261201150000-0123456789ab"},
		{"Revision", debug.BuildInfo{Main: debug.Module{Version: "(devel)"}, Settings: []debug.BuildSetting{rev}}, "devel+0123456789ab"},
		{"Dirty", debug.BuildInfo{Main: debug.Module{Version: "(devel)"}, Settings: []debug.BuildSetting{rev, {Key: "vcs.modified", Value: "true"}}}, "devel+0123456789ab-dirty"},
		{"Nothing", debug.BuildInfo{Main: debug.Module{Version: "(devel)"}}, "devel"},
	} {
		if got := FromBuildInfo(&tc.bi); got != tc.want {
			t.Errorf("%s: %q, want %q", tc.name, got, tc.want)
		}
	}
}
