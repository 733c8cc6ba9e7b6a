package container

import (
	"errors"
	"os"
	"runtime"
	"strconv"

	"golang.org/x/sys/unix"

	"github.com/warrenrl/warren/internal/errdefs"
)

// POSIX message queues live in the mqueue filesystem of their IPC
// namespace, which the kernel keeps whether or not anyone mounts it, and
// outlive every process that opened them. Sandboxes have no mqueue mount
// (and root in a sandbox with a user namespace may mount nothing), so the
// agent cannot list them; the daemon can. openMqueue makes a detached
// mount of the sandbox's mqueue filesystem from the host (fsopen in the
// sandbox's IPC namespace: the filesystem's context takes the namespace of
// the caller at fsopen, and the mount reuses the namespace's superblock,
// so nothing new is made), and wipeMqueue unlinks every queue in it.

// openMqueue returns the root directory, open for reading, of the mqueue
// filesystem of process pid's IPC namespace.
func openMqueue(pid int) (*os.File, error) {
	ns, err := os.Open("/proc/" + strconv.Itoa(pid) + "/ns/ipc")
	if err != nil {
		return nil, fsErr(err, "open the sandbox's IPC namespace")
	}
	defer ns.Close()
	fsfd, err := fsopenIn(int(ns.Fd()), "mqueue")
	if err != nil {
		return nil, errdefs.Wrap(errdefs.Internal, err, "fsopen mqueue")
	}
	defer unix.Close(fsfd)
	if err := unix.FsconfigCreate(fsfd); err != nil {
		return nil, errdefs.Wrap(errdefs.Internal, err, "create mqueue mount")
	}
	mfd, err := unix.Fsmount(fsfd, unix.FSMOUNT_CLOEXEC, unix.MOUNT_ATTR_NOEXEC|unix.MOUNT_ATTR_NOSUID|unix.MOUNT_ATTR_NODEV)
	if err != nil {
		return nil, errdefs.Wrap(errdefs.Internal, err, "mount mqueue")
	}
	defer unix.Close(mfd)
	// fsmount's descriptor is O_PATH: open its root for getdents. The
	// detached mount lives as long as this descriptor.
	dfd, err := unix.Openat(mfd, ".", unix.O_RDONLY|unix.O_DIRECTORY|unix.O_CLOEXEC, 0)
	if err != nil {
		return nil, errdefs.Wrap(errdefs.Internal, err, "open mqueue root")
	}
	return os.NewFile(uintptr(dfd), "mqueue"), nil
}

// fsopenIn calls fsopen(fstype) on a thread that has joined the IPC
// namespace nsfd, and brings the thread back to the daemon's.
func fsopenIn(nsfd int, fstype string) (int, error) {
	self, err := os.Open("/proc/thread-self/ns/ipc")
	if err != nil {
		return -1, err
	}
	defer self.Close()
	runtime.LockOSThread()
	if err := unix.Setns(nsfd, unix.CLONE_NEWIPC); err != nil {
		runtime.UnlockOSThread()
		return -1, err
	}
	fd, ferr := unix.Fsopen(fstype, unix.FSOPEN_CLOEXEC)
	if err := unix.Setns(int(self.Fd()), unix.CLONE_NEWIPC); err != nil {
		// The thread stays in the sandbox's namespace: it stays locked,
		// so the runtime ends it with this goroutine.
		if ferr == nil {
			unix.Close(fd)
		}
		return -1, err
	}
	runtime.UnlockOSThread()
	return fd, ferr
}

// wipeMqueue unlinks every queue in dir (openMqueue's). A queue still
// open somewhere goes when its last descriptor closes; none is, after a
// job's kill-all.
func wipeMqueue(dir *os.File) error {
	if _, err := dir.Seek(0, 0); err != nil {
		return err
	}
	names, err := dir.Readdirnames(-1)
	if err != nil {
		return err
	}
	for _, n := range names {
		if err := unix.Unlinkat(int(dir.Fd()), n, 0); err != nil && !errors.Is(err, unix.ENOENT) {
			return err
		}
	}
	return nil
}
