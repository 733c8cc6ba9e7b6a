package mountinfo

import (
	"slices"
	"testing"
)

func TestParse(t *testing.T) {
	const text = `25 1 0:22 / /sys/fs/cgroup ro,nosuid - tmpfs tmpfs ro,mode=755
26 25 0:23 / /a\040b rw,nosuid shared:5 master:1 - erofs /blobs/x\134y.erofs ro,directio
no separator here
1 2 3 - ext4
`
	got := Parse(text)
	if len(got) != 2 {
		t.Fatalf("%d mounts, want 2: %+v", len(got), got)
	}
	m := got[1]
	if m.Point != "/a b" || m.FSType != "erofs" || m.Source != `/blobs/x\y.erofs` || !slices.Equal(m.Options, []string{"ro", "directio"}) {
		t.Fatalf("%+v", m)
	}
	if Unescape(`\12x\0`) != `\12x\0` || Unescape(`a\011b`) != "a\tb" {
		t.Fatal("escapes")
	}
}

func TestUnder(t *testing.T) {
	// /proc is mounted on every machine this runs on; /proc/self/... is not
	// a mount point of its own.
	ms, err := Under("/proc")
	if err != nil {
		t.Fatal(err)
	}
	if len(ms) == 0 || ms[0].Point != "/proc" || ms[0].FSType != "proc" {
		t.Fatalf("%+v", ms)
	}
}
