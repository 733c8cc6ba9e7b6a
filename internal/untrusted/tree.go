package untrusted

import (
	"errors"
	"strings"

	"golang.org/x/sys/unix"
)

// tree resolves the parents of archive entries below the destination
// descriptor and remembers what the extraction created, as the roots of
// new subtrees: a directory or file created in a directory that existed
// before. Everything below a root is new too, so it needs no record.
type tree struct {
	destfd int
	// all is set when the destination itself was created: everything is
	// new and no root is recorded.
	all     bool
	roots   []string
	rootSet map[string]struct{}
	// cur caches the last parent opened: archives list a directory's
	// entries together, so most lookups are this one or one level below.
	cur curDir
}

type curDir struct {
	rel string
	fd  int
	// inRoot: cur is at or below the root root.
	inRoot bool
	root   string
}

func newTree(destfd int, all bool) *tree {
	return &tree{destfd: destfd, all: all, rootSet: map[string]struct{}{}, cur: curDir{fd: destfd}}
}

func (t *tree) close() {
	if t.cur.fd != t.destfd {
		unix.Close(t.cur.fd)
	}
	t.cur = curDir{fd: t.destfd}
}

// isUnder reports whether rel is strictly below dir (both clean, relative).
func isUnder(rel, dir string) bool {
	if dir == "" {
		return rel != ""
	}
	return len(rel) > len(dir) && rel[len(dir)] == '/' && rel[:len(dir)] == dir
}

// commonDir returns the length of the longest common whole-component
// prefix of a and b.
func commonDir(a, b string) int {
	n := min(len(a), len(b))
	i, slash := 0, 0
	for ; i < n && a[i] == b[i]; i++ {
		if a[i] == '/' {
			slash = i
		}
	}
	if (i == len(a) || a[i] == '/') && (i == len(b) || b[i] == '/') {
		return i
	}
	return slash
}

// openDir returns a descriptor of the directory rel (O_PATH; owned by the
// tree, valid until the next call) and whether the extraction created it
// or one of its ancestors. With mkdir, missing directories are created.
// Symlinks are never followed: a symlink on the way is ELOOP.
func (t *tree) openDir(rel string, mkdir bool) (int, bool, error) {
	if rel == t.cur.rel {
		return t.cur.fd, t.all || t.cur.inRoot, nil
	}
	start, startRel, inRoot, root := t.cur.fd, t.cur.rel, t.cur.inRoot, t.cur.root
	if !isUnder(rel, t.cur.rel) {
		k := commonDir(rel, t.cur.rel)
		startRel = rel[:k]
		inRoot = inRoot && len(root) <= k
		start = t.destfd
		if k > 0 {
			fd, err := openDirChunked(t.destfd, startRel)
			if err != nil {
				return -1, false, err
			}
			start = fd
		}
	}
	fd := start
	for pos := len(startRel); pos < len(rel); {
		if rel[pos] == '/' {
			pos++
		}
		end := len(rel)
		if j := strings.IndexByte(rel[pos:], '/'); j >= 0 {
			end = pos + j
		}
		next, created, err := openOrMkdir(fd, rel[pos:end], mkdir)
		if fd != t.destfd && fd != t.cur.fd {
			unix.Close(fd)
		}
		if err != nil {
			return -1, false, err
		}
		fd, pos = next, end
		if !t.all && !inRoot {
			prefix := rel[:end]
			if created {
				t.addRoot(prefix)
			}
			if t.isRoot(prefix) {
				inRoot, root = true, prefix
			}
		}
	}
	if t.cur.fd != t.destfd && t.cur.fd != fd {
		unix.Close(t.cur.fd)
	}
	t.cur = curDir{rel: rel, fd: fd, inRoot: inRoot, root: root}
	return fd, t.all || inRoot, nil
}

func (t *tree) isRoot(rel string) bool {
	_, ok := t.rootSet[rel]
	return ok
}

func (t *tree) addRoot(rel string) {
	if t.all || t.isRoot(rel) {
		return
	}
	t.rootSet[rel] = struct{}{}
	t.roots = append(t.roots, rel)
}

// created records that the entry rel was made in a parent that is new
// (parentNew) or not.
func (t *tree) created(rel string, parentNew bool) {
	if !parentNew {
		t.addRoot(rel)
	}
}

// rollback removes every root, newest first.
func (t *tree) rollback() error {
	t.close()
	var errs []error
	for i := len(t.roots) - 1; i >= 0; i-- {
		dir, base := splitName(t.roots[i])
		pfd := t.destfd
		if dir != "" {
			fd, err := openDirChunked(t.destfd, dir)
			if err != nil {
				if !errors.Is(err, unix.ENOENT) {
					errs = append(errs, err)
				}
				continue
			}
			pfd = fd
		}
		if err := removeTree(pfd, base); err != nil {
			errs = append(errs, err)
		}
		if pfd != t.destfd {
			unix.Close(pfd)
		}
	}
	return errors.Join(errs...)
}

// splitName splits a clean relative name into its parent and base.
func splitName(name string) (dir, base string) {
	i := strings.LastIndexByte(name, '/')
	if i < 0 {
		return "", name
	}
	return name[:i], name[i+1:]
}
