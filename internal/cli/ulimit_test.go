package cli

import (
	"testing"

	warrenv1 "github.com/warrenrl/warren/gen/warren/v1"
)

func TestParseUlimits(t *testing.T) {
	got, err := parseUlimits([]string{"nofile=1024:4096", "core=unlimited", "stack=8388608:unlimited", "cpu=10"})
	if err != nil {
		t.Fatal(err)
	}
	want := []*warrenv1.Rlimit{{Name: "nofile", Soft: 1024, Hard: 4096}, {Name: "core", Soft: -1, Hard: -1},
		{Name: "stack", Soft: 8388608, Hard: -1}, {Name: "cpu", Soft: 10, Hard: 10}}
	for i, w := range want {
		if got[i].GetName() != w.Name || got[i].GetSoft() != w.Soft || got[i].GetHard() != w.Hard {
			t.Errorf("%d: %v, want %v", i, got[i], w)
		}
	}
	if _, err := parseUlimits([]string{"files=1"}); err == nil {
		t.Error("unknown name accepted")
	}
	if s := formatRlimits(want); s != "nofile=1024:4096 stack=8388608:unlimited cpu=10:10" {
		t.Errorf("formatRlimits = %q", s)
	}
}
