// Package mountinfo reads the mount table of the calling process
// (/proc/self/mountinfo).
package mountinfo

import (
	"bytes"
	"os"
	"strings"
)

// Mount is one mount of the table.
type Mount struct {
	Point   string   // mount point, unescaped
	FSType  string   // filesystem type, e.g. "erofs"
	Source  string   // mount source, unescaped
	Options []string // superblock options
	// Root is the directory of the filesystem mounted there (a bind
	// mount's source, relative to its filesystem's root), unescaped;
	// MountOptions are the mount's own flags (ro, nosuid, nodev, ...).
	Root         string
	MountOptions []string
	// Dev is the filesystem's device, "major:minor" as the table
	// writes it (what stat's st_dev of a path on it says).
	Dev string
}

// Read parses /proc/self/mountinfo.
func Read() ([]Mount, error) {
	data, err := readWhole("/proc/self/mountinfo")
	if err != nil {
		return nil, err
	}
	return Parse(string(data)), nil
}

// readWhole reads a seq_file such as mountinfo whole, and again until two
// readings agree (at most 5): the kernel fills each read(2) with a page
// or so of records and resumes the next at a record index, so a mount
// made or removed between two reads shifts the table and a line is
// skipped or doubled. A table that keeps changing is returned as last
// read.
func readWhole(path string) ([]byte, error) {
	prev, err := os.ReadFile(path)
	if err != nil {
		return nil, err
	}
	for range 4 {
		cur, err := os.ReadFile(path)
		if err != nil {
			return nil, err
		}
		if bytes.Equal(cur, prev) {
			return cur, nil
		}
		prev = cur
	}
	return prev, nil
}

// Under lists the mounts at dir or below it, in table order (a mount
// before the ones on top of it).
func Under(dir string) ([]Mount, error) {
	all, err := Read()
	if err != nil {
		return nil, err
	}
	var out []Mount
	for _, m := range all {
		if m.Point == dir || strings.HasPrefix(m.Point, dir+"/") {
			out = append(out, m)
		}
	}
	return out, nil
}

// Parse parses mountinfo text; lines it cannot read are skipped.
func Parse(text string) []Mount {
	var out []Mount
	for _, line := range strings.Split(text, "\n") {
		// id parent major:minor root mountpoint opts [optional...] - fstype source superopts
		pre, post, ok := strings.Cut(line, " - ")
		if !ok {
			continue
		}
		f, p := strings.Fields(pre), strings.Fields(post)
		if len(f) < 5 || len(p) < 1 {
			continue
		}
		m := Mount{Point: Unescape(f[4]), FSType: p[0], Root: Unescape(f[3]), Dev: f[2]}
		if len(f) > 5 {
			m.MountOptions = strings.Split(f[5], ",")
		}
		if len(p) > 1 {
			m.Source = Unescape(p[1])
		}
		if len(p) > 2 {
			m.Options = strings.Split(p[2], ",")
		}
		out = append(out, m)
	}
	return out
}

// Unescape undoes the \NNN octal escapes the kernel writes for space, tab,
// newline and backslash in mountinfo fields.
func Unescape(s string) string {
	if !strings.Contains(s, `\`) {
		return s
	}
	var b strings.Builder
	for i := 0; i < len(s); i++ {
		if s[i] == '\\' && i+3 < len(s) && isOctal(s[i+1]) && isOctal(s[i+2]) && isOctal(s[i+3]) {
			b.WriteByte((s[i+1]-'0')<<6 | (s[i+2]-'0')<<3 | (s[i+3] - '0'))
			i += 3
			continue
		}
		b.WriteByte(s[i])
	}
	return b.String()
}

func isOctal(c byte) bool { return c >= '0' && c <= '7' }
