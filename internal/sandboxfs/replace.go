package sandboxfs

import (
	"bytes"
	"context"
	"crypto/rand"
	"encoding/hex"
	"io"
	"os"

	"golang.org/x/sys/unix"

	"github.com/warrenrl/warren/internal/errdefs"
	"github.com/warrenrl/warren/internal/tarx/inroot"
)

// ReplaceIf replaces the regular file at p with data, but only while it
// holds exactly old: it reports false, changing nothing, where p is
// missing, is a symlink or anything but a regular file, or holds
// anything else. The daemon rewrites files it wrote itself this way
// (/etc/resolv.conf after a network change) without overwriting what
// the sandbox made of them.
//
// The replacement is atomic: data goes to a new file in p's directory,
// which is exchanged with p (renameat2 RENAME_EXCHANGE), so a reader
// sees the old content or the new, never a part. The old file is then
// checked again, now under the temporary name: an edit the sandbox made
// between the first check and the exchange puts it back. The new file
// takes the old one's mode and owner. Symlinks in p's directories are
// followed inside the root, as for every operation.
func (f *FS) ReplaceIf(ctx context.Context, p string, old, data []byte) (replaced bool, err error) {
	err = f.asSandboxRoot(func() error {
		replaced, err = f.replaceIf(ctx, p, old, data)
		return err
	})
	return replaced, err
}

func (f *FS) replaceIf(ctx context.Context, p string, old, data []byte) (bool, error) {
	cp := inroot.Clean(p)
	if cp == "/" {
		return false, errdefs.Invalidf("cannot replace /")
	}
	rootfd, err := f.enter(ctx)
	if err != nil {
		return false, err
	}
	defer unix.Close(rootfd)
	dir, base := inroot.Split(cp)
	dirfd, err := openDirChecked(rootfd, dir)
	if errdefs.CategoryOf(err) == errdefs.NotFound {
		return false, nil
	}
	if err != nil {
		return false, err
	}
	defer unix.Close(dirfd)
	st, same, err := holds(dirfd, base, cp, old)
	if err != nil || !same {
		return false, err
	}
	if beforeExchange != nil {
		beforeExchange()
	}
	tmp := "." + base + ".warren-" + randomSuffix()
	if err := writeNew(dirfd, tmp, cp, data, st); err != nil {
		return false, err
	}
	if err := unix.Renameat2(dirfd, tmp, dirfd, base, unix.RENAME_EXCHANGE); err != nil {
		_ = unix.Unlinkat(dirfd, tmp, 0)
		return false, pathErr(cp, err)
	}
	// tmp now names the file that was at p.
	_, same, err = holds(dirfd, tmp, cp, old)
	if err != nil || !same {
		if xerr := unix.Renameat2(dirfd, tmp, dirfd, base, unix.RENAME_EXCHANGE); xerr != nil {
			// The sandbox's edit stays, under tmp; p has data.
			return true, pathErr(cp, xerr)
		}
		_ = unix.Unlinkat(dirfd, tmp, 0)
		return false, err
	}
	if err := unix.Unlinkat(dirfd, tmp, 0); err != nil {
		return true, pathErr(cp, err)
	}
	return true, nil
}

// beforeExchange, when set (tests), runs between ReplaceIf's check of
// the file and the exchange: where a sandbox's edit would race it.
var beforeExchange func()

// holds reports whether base in dirfd is a regular file (not followed
// if a symlink) holding exactly want, and its stat. A missing file, a
// symlink or a special file is false without an error.
func holds(dirfd int, base, cp string, want []byte) (unix.Stat_t, bool, error) {
	var st unix.Stat_t
	pfd, err := unix.Openat(dirfd, base, unix.O_PATH|unix.O_NOFOLLOW|unix.O_CLOEXEC, 0)
	if err == unix.ENOENT {
		return st, false, nil
	}
	if err != nil {
		return st, false, pathErr(cp, err)
	}
	defer unix.Close(pfd)
	if err := checkFS(pfd, cp); err != nil {
		return st, false, err
	}
	if err := unix.Fstat(pfd, &st); err != nil {
		return st, false, pathErr(cp, err)
	}
	if st.Mode&unix.S_IFMT != unix.S_IFREG || st.Size != int64(len(want)) {
		return st, false, nil
	}
	fd, err := reopen(pfd, unix.O_RDONLY|unix.O_NONBLOCK, cp)
	if err != nil {
		return st, false, err
	}
	file := os.NewFile(uintptr(fd), cp)
	defer file.Close()
	// One byte more than want: a file grown since the fstat differs.
	got, err := io.ReadAll(io.LimitReader(file, int64(len(want))+1))
	if err != nil {
		return st, false, pathErr(cp, err)
	}
	return st, bytes.Equal(got, want), nil
}

// writeNew creates tmp in dirfd holding data, with like's mode and
// owner; it leaves nothing behind on error.
func writeNew(dirfd int, tmp, cp string, data []byte, like unix.Stat_t) (err error) {
	fd, err := createIn(dirfd, tmp, cp, unix.O_WRONLY, like.Mode&0o777)
	if err != nil {
		if errdefs.CategoryOf(err) == errdefs.PermissionDenied {
			return err
		}
		return pathErr(cp, err)
	}
	file := os.NewFile(uintptr(fd), cp)
	defer func() {
		if err != nil {
			_ = unix.Unlinkat(dirfd, tmp, 0)
		}
	}()
	if _, err := file.Write(data); err != nil {
		file.Close()
		return pathErr(cp, err)
	}
	// Owner first: a chown clears setuid and setgid bits, which the
	// chmod then sets as the old file had them.
	if err := unix.Fchown(fd, int(like.Uid), int(like.Gid)); err != nil {
		file.Close()
		return pathErr(cp, err)
	}
	if err := unix.Fchmod(fd, like.Mode&0o7777); err != nil {
		file.Close()
		return pathErr(cp, err)
	}
	if err := file.Close(); err != nil {
		return pathErr(cp, err)
	}
	return nil
}

func randomSuffix() string {
	var b [6]byte
	_, _ = rand.Read(b[:])
	return hex.EncodeToString(b[:])
}
