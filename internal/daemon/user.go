package daemon

import (
	"bufio"
	"bytes"
	"strconv"
	"strings"

	"github.com/warrenrl/warren/internal/errdefs"
)

// identity is who a process runs as.
type identity struct {
	UID, GID uint32
	Home     string // "" when unknown
}

// fileReader reads a file of the sandbox (through sandboxfs, so symlinks
// resolve inside the sandbox root); a missing file is an error of category
// NotFound. It is nil when the backend has no host-visible root.
type fileReader func(path string) ([]byte, error)

// resolveUser turns the user field of an exec request into an identity:
//
//	""           root (0:0)
//	"N", "N:M"   numeric uid (and gid); without a gid, the primary group of
//	             the uid's /etc/passwd entry, or the uid itself when none
//	"name"       looked up in the sandbox's /etc/passwd
//	"u:g"        either part a number or a name (/etc/passwd, /etc/group)
//
// An unknown name is an error of category Invalid.
func resolveUser(spec string, read fileReader) (identity, error) {
	if spec == "" || spec == "root" || spec == "0" || spec == "0:0" {
		return identity{Home: "/root"}, nil
	}
	if err := checkUserSpec(spec); err != nil {
		return identity{}, err
	}
	userPart, groupPart, hasGroup := strings.Cut(spec, ":")
	var passwd []passwdEntry
	passwdRead := false
	loadPasswd := func() error {
		if passwdRead {
			return nil
		}
		passwdRead = true
		data, err := readOptional(read, "/etc/passwd")
		if err != nil {
			return err
		}
		passwd = parsePasswd(data)
		return nil
	}

	var id identity
	var entry *passwdEntry
	if uid, ok := parseID(userPart); ok {
		id.UID = uid
		if read != nil {
			// For the primary group and home of the uid, if it has an entry.
			if err := loadPasswd(); err != nil {
				return identity{}, err
			}
			entry = findUID(passwd, uid)
		}
	} else {
		if !validName(userPart) {
			return identity{}, errdefs.Invalidf("invalid user name %q", userPart)
		}
		if read == nil {
			return identity{}, errdefs.Unsupportedf("user names are not supported by this backend: use a numeric uid")
		}
		if err := loadPasswd(); err != nil {
			return identity{}, err
		}
		entry = findName(passwd, userPart)
		if entry == nil {
			return identity{}, errdefs.Invalidf("unknown user %q: not in the sandbox's /etc/passwd", userPart)
		}
		id.UID = entry.uid
	}
	switch {
	case entry != nil:
		id.GID, id.Home = entry.gid, entry.home
	default:
		id.GID = id.UID
	}
	if hasGroup {
		if gid, ok := parseID(groupPart); ok {
			id.GID = gid
		} else {
			if !validName(groupPart) {
				return identity{}, errdefs.Invalidf("invalid group name %q", groupPart)
			}
			if read == nil {
				return identity{}, errdefs.Unsupportedf("group names are not supported by this backend: use a numeric gid")
			}
			data, err := readOptional(read, "/etc/group")
			if err != nil {
				return identity{}, err
			}
			gid, ok := findGroup(data, groupPart)
			if !ok {
				return identity{}, errdefs.Invalidf("unknown group %q: not in the sandbox's /etc/group", groupPart)
			}
			id.GID = gid
		}
	}
	return id, nil
}

// readOptional reads a file; a missing file reads as empty.
func readOptional(read fileReader, path string) ([]byte, error) {
	if read == nil {
		return nil, nil
	}
	data, err := read(path)
	if err != nil {
		if errdefs.CategoryOf(err) == errdefs.NotFound {
			return nil, nil
		}
		return nil, errdefs.New(errdefs.CategoryOf(err), "read %s of sandbox: %w", path, err)
	}
	return data, nil
}

// parseID parses a uid or gid; -1 (4294967295) is not a valid id.
func parseID(s string) (uint32, bool) {
	if s == "" || s[0] < '0' || s[0] > '9' {
		return 0, false
	}
	n, err := strconv.ParseUint(s, 10, 32)
	if err != nil || n == 1<<32-1 {
		return 0, false
	}
	return uint32(n), true
}

// validName accepts the user and group names that /etc/passwd can hold.
func validName(s string) bool {
	if s == "" || len(s) > 256 {
		return false
	}
	for _, r := range s {
		if r <= ' ' || r == ':' || r == '/' || r == 0x7f {
			return false
		}
	}
	return true
}

type passwdEntry struct {
	name     string
	uid, gid uint32
	home     string
}

// parsePasswd parses /etc/passwd lines "name:pw:uid:gid:gecos:home:shell";
// malformed lines are skipped.
func parsePasswd(data []byte) []passwdEntry {
	var out []passwdEntry
	sc := bufio.NewScanner(bytes.NewReader(data))
	sc.Buffer(make([]byte, 0, 4096), 1<<20)
	for sc.Scan() {
		line := strings.TrimSpace(sc.Text())
		if line == "" || line[0] == '#' {
			continue
		}
		f := strings.Split(line, ":")
		if len(f) < 4 || f[0] == "" {
			continue
		}
		uid, ok1 := parseID(f[2])
		gid, ok2 := parseID(f[3])
		if !ok1 || !ok2 {
			continue
		}
		e := passwdEntry{name: f[0], uid: uid, gid: gid}
		if len(f) >= 6 {
			e.home = f[5]
		}
		out = append(out, e)
	}
	return out
}

func findName(es []passwdEntry, name string) *passwdEntry {
	for i := range es {
		if es[i].name == name {
			return &es[i]
		}
	}
	return nil
}

func findUID(es []passwdEntry, uid uint32) *passwdEntry {
	for i := range es {
		if es[i].uid == uid {
			return &es[i]
		}
	}
	return nil
}

// findGroup looks a group name up in /etc/group lines "name:pw:gid:members".
func findGroup(data []byte, name string) (uint32, bool) {
	sc := bufio.NewScanner(bytes.NewReader(data))
	sc.Buffer(make([]byte, 0, 4096), 1<<20)
	for sc.Scan() {
		f := strings.Split(strings.TrimSpace(sc.Text()), ":")
		if len(f) < 3 || f[0] != name {
			continue
		}
		if gid, ok := parseID(f[2]); ok {
			return gid, true
		}
	}
	return 0, false
}

// checkUserSpec checks the form of a user field (resolveUser) without
// looking names up: a sandbox's default user is checked at create, when
// its /etc/passwd may still change.
func checkUserSpec(spec string) error {
	if spec == "" {
		return nil
	}
	userPart, groupPart, hasGroup := strings.Cut(spec, ":")
	if userPart == "" || (hasGroup && groupPart == "") || strings.Contains(groupPart, ":") ||
		len(spec) > 256 || strings.ContainsAny(spec, "\x00\n/ \t") {
		return errdefs.Invalidf("invalid user %q: want name, uid or uid:gid", spec)
	}
	return nil
}
