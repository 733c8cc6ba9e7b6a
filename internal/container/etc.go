package container

import (
	"errors"
	"os"
	"path/filepath"
	"unsafe"

	"golang.org/x/sys/unix"

	"github.com/warrenrl/warren/internal/backend"
	"github.com/warrenrl/warren/internal/etcfiles"
)

// writeEtc puts the sandbox's own /etc files (hosts, hostname,
// resolv.conf) into its upper directory before the overlay is mounted:
// they are then the sandbox's files like any it writes (it may edit or
// replace them, sed -i and rename included, which binds of a file would
// refuse with EBUSY), they cost no mount, superblock or memory of their
// own (page cache on the upper's disk, reclaimable), and a commit sees
// them and leaves them out while unchanged.
//
// upper/etc takes the mode, owner and times of the image's /etc, which
// it then shows (a merged directory shows its upper's attributes). Where
// the image's /etc is not a directory (a symlink, say) an upper etc
// would hide what it leads to, so the image keeps its own files; where
// it has none (or a layer whited it out), /etc is made 0755 root.
//
// pooled says upper came from the pool (pool.go), with an etc directory
// holding empty files of etcfiles.Names, which are filled in place (never
// truncated: ext4 flushes a file truncated and rewritten at its close)
// or, where the sandbox gets none, removed.
//
// userns (nil: none) is the sandbox's id mapping: the upper directory
// keeps host ids, so what is written here is given to its root.
func writeEtc(upper string, layers []backend.Layer, files []etcfiles.File, pooled bool, userns *UserNS) error {
	dir := filepath.Join(upper, "etc")
	if len(files) == 0 {
		return dropPooledEtc(dir, pooled)
	}
	var st unix.Stat_t
	found := false
	for _, l := range layers {
		err := unix.Lstat(filepath.Join(l.Dir, "etc"), &st)
		if errors.Is(err, unix.ENOENT) {
			continue
		}
		if err != nil {
			return fsErr(err, "image /etc")
		}
		if st.Mode&unix.S_IFMT == unix.S_IFCHR && st.Rdev == 0 {
			break // whited out: as if absent
		}
		if st.Mode&unix.S_IFMT != unix.S_IFDIR {
			return dropPooledEtc(dir, pooled)
		}
		found = true
		break
	}
	mode, uid, gid := uint32(0o755), 0, 0
	if found {
		mode, uid, gid = st.Mode&0o7777, int(st.Uid), int(st.Gid)
	}
	if err := unix.Mkdir(dir, mode); err != nil && !(pooled && err == unix.EEXIST) {
		return fsErr(&os.PathError{Op: "mkdir", Path: dir, Err: err}, "sandbox /etc")
	}
	fd, err := unix.Open(dir, unix.O_RDONLY|unix.O_DIRECTORY|unix.O_NOFOLLOW|unix.O_CLOEXEC, 0)
	if err != nil {
		return fsErr(&os.PathError{Op: "open", Path: dir, Err: err}, "sandbox /etc")
	}
	defer unix.Close(fd)
	for _, f := range files {
		if err := writeFile(fd, f.Name, f.Data, pooled); err != nil {
			return fsErr(&os.PathError{Op: "write", Path: filepath.Join(dir, f.Name), Err: err}, "sandbox /etc")
		}
		if err := shiftOwner(filepath.Join(dir, f.Name), userns, 0, 0); err != nil {
			return err
		}
	}
	if userns != nil {
		// The image's owner of /etc, as the sandbox sees it.
		uid, gid = int(userns.Base)+uid, int(userns.Base)+gid
	}
	// Mode and owner only where they differ (the pool's 0755 root is
	// what most images have; the umask may have narrowed it): the chmod
	// through /proc/self/fd this replaced was ~20 us of each create.
	var have unix.Stat_t
	if err := unix.Fstat(fd, &have); err != nil {
		return fsErr(&os.PathError{Op: "stat", Path: dir, Err: err}, "sandbox /etc")
	}
	if have.Mode&0o7777 != mode {
		if err := unix.Fchmod(fd, mode); err != nil {
			return fsErr(&os.PathError{Op: "chmod", Path: dir, Err: err}, "sandbox /etc")
		}
	}
	if int(have.Uid) != uid || int(have.Gid) != gid {
		if err := unix.Fchown(fd, uid, gid); err != nil {
			return fsErr(&os.PathError{Op: "chown", Path: dir, Err: err}, "sandbox /etc")
		}
	}
	// Times last: the writes above moved them.
	if found {
		if err := futimens(fd, [2]unix.Timespec{st.Atim, st.Mtim}); err != nil {
			return fsErr(&os.PathError{Op: "utimes", Path: dir, Err: err}, "sandbox /etc")
		}
	}
	return nil
}

// futimens sets fd's times: utimensat with no path, as the C library's
// futimens calls it (x/sys has no wrapper that takes a nil path).
func futimens(fd int, ts [2]unix.Timespec) error {
	_, _, e := unix.Syscall6(unix.SYS_UTIMENSAT, uintptr(fd), 0, uintptr(unsafe.Pointer(&ts[0])), 0, 0, 0)
	if e != 0 {
		return e
	}
	return nil
}

// dropPooledEtc removes the pool's etc directory and its empty files
// from an upper directory that gets none.
func dropPooledEtc(dir string, pooled bool) error {
	if !pooled {
		return nil
	}
	for _, name := range etcfiles.Names {
		_ = unix.Unlink(filepath.Join(dir, name))
	}
	if err := unix.Rmdir(dir); err != nil && err != unix.ENOENT {
		return fsErr(&os.PathError{Op: "rmdir", Path: dir, Err: err}, "sandbox /etc")
	}
	return nil
}

// writeFile writes data to name in dirfd, mode 0644: a new file, or
// (existing: the pool's) an empty one.
func writeFile(dirfd int, name string, data []byte, existing bool) error {
	flags := unix.O_WRONLY | unix.O_CREAT | unix.O_EXCL | unix.O_NOFOLLOW | unix.O_CLOEXEC
	if existing {
		flags &^= unix.O_EXCL
	}
	fd, err := unix.Openat(dirfd, name, flags, 0o644)
	if err != nil {
		return err
	}
	for len(data) > 0 {
		n, err := unix.Write(fd, data)
		if err != nil {
			unix.Close(fd)
			return err
		}
		data = data[n:]
	}
	return unix.Close(fd)
}
