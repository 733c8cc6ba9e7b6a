package sandboxfs

import (
	"path"
	"strconv"
	"strings"

	"golang.org/x/sys/unix"

	"github.com/warrenrl/warren/internal/errdefs"
	"github.com/warrenrl/warren/internal/tarx/inroot"
)

// The daemon reaches a sandbox's root through the sandbox's init, so the
// sandbox's own mounts are visible to file calls, and the calls run with
// the daemon's privileges (host root): a WriteFile of /proc/1/oom_score_adj
// once succeeded. Files on kernel pseudo-filesystems are the kernel's
// interface, not the sandbox's data, so file calls refuse every one of
// them, whatever path or symlink leads there: the check is on the
// filesystem type (fstatfs) of what the path resolved to, or of the
// directory an entry is created in or removed from.

// Magic numbers golang.org/x/sys/unix lacks (include/uapi/linux/magic.h).
const (
	configfsMagic = 0x62656570
	fusectlMagic  = 0x65735543
	mqueueMagic   = 0x19800202
)

// pseudoFS names the kernel pseudo-filesystems file calls never touch.
var pseudoFS = map[int64]string{
	unix.PROC_SUPER_MAGIC:     "the sandbox's /proc",
	unix.SYSFS_MAGIC:          "the sandbox's /sys",
	unix.CGROUP_SUPER_MAGIC:   "a cgroup filesystem",
	unix.CGROUP2_SUPER_MAGIC:  "a cgroup2 filesystem",
	unix.SECURITYFS_MAGIC:     "securityfs",
	unix.DEBUGFS_MAGIC:        "debugfs",
	unix.TRACEFS_MAGIC:        "tracefs",
	unix.BPF_FS_MAGIC:         "a bpf filesystem",
	unix.DEVPTS_SUPER_MAGIC:   "devpts",
	configfsMagic:             "configfs",
	unix.PSTOREFS_MAGIC:       "pstore",
	unix.EFIVARFS_MAGIC:       "efivarfs",
	unix.SELINUX_MAGIC:        "selinuxfs",
	unix.SMACK_MAGIC:          "smackfs",
	unix.BINFMTFS_MAGIC:       "binfmt_misc",
	fusectlMagic:              "fusectl",
	unix.NSFS_MAGIC:           "nsfs",
	unix.RDTGROUP_SUPER_MAGIC: "resctrl",
	mqueueMagic:               "mqueue",
}

// checkFS refuses (PermissionDenied) when fd, which sandbox path p
// resolved to, is on a kernel pseudo-filesystem.
func checkFS(fd int, p string) error {
	name, err := pseudoOf(fd)
	if err != nil {
		return pathErr(p, err)
	}
	if name != "" {
		return denied(p, "is on "+name)
	}
	return nil
}

// pseudoOf names the pseudo-filesystem fd is on, or returns "".
func pseudoOf(fd int) (string, error) {
	var sfs unix.Statfs_t
	if err := unix.Fstatfs(fd, &sfs); err != nil {
		return "", err
	}
	return pseudoFS[int64(sfs.Type)], nil
}

func denied(p, where string) error {
	return errdefs.PermissionDeniedf("%s %s; file calls never touch /proc, /sys or other kernel filesystems: run a command in the sandbox instead", p, where)
}

// checkFailed explains a failed resolution of cp: when the deepest
// ancestor of cp that resolves is on a pseudo-filesystem, the failure is
// that refusal (a NotFound for /proc/self/environ, whose /proc/self
// names no process of the sandbox for the daemon, would hint that
// another path could work); otherwise it is pathErr(cp, err). Only
// failures pay for the walk.
func checkFailed(rootfd int, cp string, err error) error {
	for d := cp; d != "/"; {
		d = path.Dir(d)
		fd, oerr := inroot.Open(rootfd, d, unix.O_PATH, 0)
		if oerr != nil {
			continue
		}
		name, serr := pseudoOf(fd)
		unix.Close(fd)
		if serr == nil && name != "" {
			return denied(cp, "is below "+d+", on "+name)
		}
		break
	}
	return pathErr(cp, err)
}

// openPath resolves cp inside the root (a symlink in the final component
// is followed) to an O_PATH descriptor that is not on a pseudo-filesystem.
func openPath(rootfd int, cp string) (int, unix.Stat_t, error) {
	var st unix.Stat_t
	fd, err := inroot.Open(rootfd, cp, unix.O_PATH, 0)
	if err != nil {
		return -1, st, checkFailed(rootfd, cp, err)
	}
	if err := checkFS(fd, cp); err != nil {
		unix.Close(fd)
		return -1, st, err
	}
	if err := unix.Fstat(fd, &st); err != nil {
		unix.Close(fd)
		return -1, st, pathErr(cp, err)
	}
	return fd, st, nil
}

// regularOnly refuses anything but a regular file: the daemon never
// opens a device node or FIFO a sandbox planted (its /dev is a directory
// on a tmpfs that allows device nodes), where an open alone can block or
// act on the device.
func regularOnly(st unix.Stat_t, cp string) error {
	switch st.Mode & unix.S_IFMT {
	case unix.S_IFREG:
		return nil
	case unix.S_IFDIR:
		return errdefs.Invalidf("is a directory: %s", cp)
	}
	return errdefs.Invalidf("not a regular file: %s", cp)
}

// reopen opens the file behind the O_PATH descriptor fd with flags,
// through /proc/self/fd: the same inode, so nothing the sandbox renames
// meanwhile changes what is opened.
func reopen(fd, flags int, cp string) (int, error) {
	for {
		nfd, err := unix.Open("/proc/self/fd/"+strconv.Itoa(fd), flags|unix.O_CLOEXEC|unix.O_NOCTTY, 0)
		if err == unix.EINTR {
			continue
		}
		if err != nil {
			return -1, pathErr(cp, err)
		}
		return nfd, nil
	}
}

// openRegular resolves cp (following a final symlink inside the root) and
// opens it with flags if it is a regular file on an ordinary filesystem.
func openRegular(rootfd int, cp string, flags int) (int, unix.Stat_t, error) {
	pfd, st, err := openPath(rootfd, cp)
	if err != nil {
		return -1, st, err
	}
	defer unix.Close(pfd)
	if err := regularOnly(st, cp); err != nil {
		return -1, st, err
	}
	fd, err := reopen(pfd, flags, cp)
	return fd, st, err
}

// openDirChecked opens directory dir (O_PATH, symlinks followed inside
// the root) when it is not on a pseudo-filesystem.
func openDirChecked(rootfd int, dir string) (int, error) {
	fd, err := inroot.Open(rootfd, dir, unix.O_PATH|unix.O_DIRECTORY, 0)
	if err != nil {
		return -1, checkFailed(rootfd, dir, err)
	}
	if err := checkFS(fd, dir); err != nil {
		unix.Close(fd)
		return -1, err
	}
	return fd, nil
}

// maxHops bounds the dangling symlinks openForWrite follows, as the
// kernel's 40 (MAXSYMLINKS).
const maxHops = 40

// openForWrite opens the regular file cp for writing with flags, or
// creates it (mode perm) in a directory that is not on a pseudo-
// filesystem. A dangling symlink at cp is followed and its target
// created; relative targets are taken against the link's directory as
// named in cp, and whatever the result it resolves inside the root. An
// existing file is opened through openRegular, never by name with
// O_CREAT, so a device node or FIFO planted meanwhile is refused, not
// opened.
func openForWrite(rootfd int, cp string, flags int, perm uint32) (fd int, created bool, err error) {
	for hop := 0; hop < maxHops; hop++ {
		fd, _, err = openRegular(rootfd, cp, flags)
		if errdefs.CategoryOf(err) != errdefs.NotFound {
			return fd, false, err
		}
		dirfd, base, err := inroot.OpenParent(rootfd, cp)
		if err != nil {
			return -1, false, checkFailed(rootfd, cp, err)
		}
		fd, err = createIn(dirfd, base, cp, flags, perm)
		if err == nil {
			unix.Close(dirfd)
			return fd, true, nil
		}
		if err != unix.EEXIST {
			unix.Close(dirfd)
			if errdefs.CategoryOf(err) == errdefs.PermissionDenied {
				return -1, false, err
			}
			return -1, false, pathErr(cp, err)
		}
		// Something is there now: a dangling symlink to follow, or a
		// file that appeared since the first open, which the next round
		// opens.
		target, lerr := inroot.Readlink(dirfd, base)
		unix.Close(dirfd)
		if lerr == nil {
			if !path.IsAbs(target) {
				target = path.Join(path.Dir(cp), target)
			}
			cp = inroot.Clean(target)
		}
	}
	return -1, false, errdefs.Invalidf("too many levels of symbolic links: %s", cp)
}

// createIn creates base exclusively in dirfd after checking dirfd's
// filesystem; a bare unix.EEXIST means base exists.
func createIn(dirfd int, base, cp string, flags int, perm uint32) (int, error) {
	if err := checkFS(dirfd, path.Dir(cp)); err != nil {
		return -1, err
	}
	for {
		fd, err := unix.Openat(dirfd, base, flags|unix.O_CREAT|unix.O_EXCL|unix.O_NOFOLLOW|unix.O_NOCTTY|unix.O_CLOEXEC, perm&0o777)
		if err != unix.EINTR {
			return fd, err
		}
	}
}

// mkdirAll makes sure directory p exists, creating missing components
// 0755 (not subject to the umask), and returns an O_PATH descriptor of
// it. Symlinks on the way are followed inside the root. Unlike
// inroot.MkdirAll, each directory is checked before anything is created
// in it and the result is checked too: no directory is ever made on a
// pseudo-filesystem (a mkdir in a cgroupfs makes a cgroup).
func mkdirAll(rootfd int, p string, mode uint32) (int, error) {
	c := inroot.Clean(p)
	if fd, err := inroot.Open(rootfd, c, unix.O_PATH|unix.O_DIRECTORY, 0); err == nil {
		if err := checkFS(fd, c); err != nil {
			unix.Close(fd)
			return -1, err
		}
		return fd, nil
	} else if inroot.Errno(err) != unix.ENOENT {
		return -1, checkFailed(rootfd, c, err)
	}
	cur, err := openDirChecked(rootfd, "/")
	if err != nil {
		return -1, err
	}
	prefix := ""
	for _, comp := range strings.Split(c[1:], "/") {
		prefix += "/" + comp
		next, err := mkdirStep(rootfd, cur, comp, prefix, mode)
		unix.Close(cur)
		if err != nil {
			return -1, err
		}
		cur = next
	}
	return cur, nil
}

// mkdirStep resolves prefix, whose parent directory is cur, creating its
// last component comp in cur if it is missing.
func mkdirStep(rootfd, cur int, comp, prefix string, mode uint32) (int, error) {
	next, err := openDirChecked(rootfd, prefix)
	if err == nil || errdefs.CategoryOf(err) != errdefs.NotFound {
		return next, err
	}
	if err := checkFS(cur, path.Dir(prefix)); err != nil {
		return -1, err
	}
	switch merr := unix.Mkdirat(cur, comp, mode&0o777); merr {
	case nil:
		next, err := unix.Openat(cur, comp, unix.O_PATH|unix.O_DIRECTORY|unix.O_NOFOLLOW|unix.O_CLOEXEC, 0)
		if err != nil {
			return -1, pathErr(prefix, err)
		}
		if err := inroot.Chmod(next, mode&0o7777); err != nil {
			unix.Close(next)
			return -1, pathErr(prefix, err)
		}
		return next, nil
	case unix.EEXIST:
		// Lost a race, or a dangling symlink sits there: resolve again
		// and report what that finds.
		return openDirChecked(rootfd, prefix)
	default:
		return -1, pathErr(prefix, merr)
	}
}

// notMountPoint refuses (Conflict, the EBUSY a process in the sandbox
// would get) when the entry base of dirfd is a mount point. The kernel
// refuses to remove a mount point only in the caller's own mount
// namespace: removing the sandbox's /dev from the daemon's would detach
// the mount from under the sandbox.
func notMountPoint(dirfd int, base, cp string) error {
	var dst, est unix.Statx_t
	if err := unix.Statx(dirfd, "", unix.AT_EMPTY_PATH, unix.STATX_MNT_ID, &dst); err != nil {
		return pathErr(cp, err)
	}
	if err := unix.Statx(dirfd, base, unix.AT_SYMLINK_NOFOLLOW, unix.STATX_MNT_ID, &est); err != nil {
		return pathErr(cp, err)
	}
	if dst.Mnt_id != est.Mnt_id {
		return errdefs.Conflictf("busy: %s is a mount point of the sandbox; file calls never remove mount points", cp)
	}
	return nil
}
