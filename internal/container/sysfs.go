package container

import (
	"fmt"
	"os"
	"runtime"
	"time"

	"golang.org/x/sys/unix"

	"github.com/warrenrl/warren/internal/errdefs"
)

// Every sandbox sees one node-wide sysfs, mounted once from a short-lived
// network namespace, instead of a sysfs of its own. A sysfs mount in each sandbox's network namespace is a
// superblock per sandbox, and every live superblock widens every memory
// cgroup's shrinker map on the node: at 3,200 sandboxes one superblock per
// sandbox costs ~50 KiB of kernel memory per sandbox. The shared mount
// still hides the host's network devices: sysfs shows the devices of the
// mounter's network namespace, and that namespace is gone once the
// mounting thread exits (the mount keeps only a passive reference), so
// /sys/class/net is empty. What sandboxes lose is their own lo there, which
// tools read through netlink and /proc instead.

// sysfsDir is where the shared sysfs is mounted.
func (b *Backend) sysfsDir() string { return b.opts.RunDir + "/sysfs" }

// mountSharedSysfs mounts the shared sysfs at dir, or keeps the one an
// earlier daemon mounted there.
func mountSharedSysfs(dir string) error {
	if sharedSysfsAt(dir) {
		return nil
	}
	// Something else is mounted there (or nothing): start afresh.
	for unix.Unmount(dir, unix.MNT_DETACH) == nil {
	}
	if err := os.MkdirAll(dir, 0o555); err != nil {
		return errdefs.Wrap(errdefs.Internal, err, "create shared sysfs mount point")
	}
	errc := make(chan error, 1)
	go func() {
		runtime.LockOSThread()
		orig, err := unix.Open("/proc/thread-self/ns/net", unix.O_RDONLY|unix.O_CLOEXEC, 0)
		if err != nil {
			runtime.UnlockOSThread()
			errc <- fmt.Errorf("open network namespace: %w", err)
			return
		}
		defer unix.Close(orig)
		if err := unix.Unshare(unix.CLONE_NEWNET); err != nil {
			runtime.UnlockOSThread()
			errc <- fmt.Errorf("unshare network namespace: %w", err)
			return
		}
		errc <- unix.Mount("sysfs", dir, "sysfs", unix.MS_RDONLY|unix.MS_NOSUID|unix.MS_NODEV|unix.MS_NOEXEC, "")
		// Back to the daemon's namespace, which drops the last reference to
		// the new one. If that fails the thread stays locked, and the
		// runtime retires it with this goroutine.
		if unix.Setns(orig, unix.CLONE_NEWNET) == nil {
			runtime.UnlockOSThread()
		}
	}()
	if err := <-errc; err != nil {
		return errdefs.Wrap(errdefs.Internal, err, "mount shared sysfs")
	}
	// The namespace's lo leaves sysfs when the kernel tears the namespace
	// down, asynchronously; wait for it so every sandbox sees the same /sys.
	for deadline := time.Now().Add(2 * time.Second); time.Now().Before(deadline); time.Sleep(5 * time.Millisecond) {
		if ents, err := os.ReadDir(dir + "/class/net"); err == nil && len(ents) == 0 {
			break
		}
	}
	if !sharedSysfsAt(dir) {
		return errdefs.Internalf("shared sysfs at %s shows network devices", dir)
	}
	return nil
}

// sharedSysfsAt reports whether dir is a sysfs that shows no network
// device but perhaps a loopback: ours, not one of the host's.
func sharedSysfsAt(dir string) bool {
	var st unix.Statfs_t
	if unix.Statfs(dir, &st) != nil || st.Type != unix.SYSFS_MAGIC {
		return false
	}
	ents, err := os.ReadDir(dir + "/class/net")
	return err == nil && (len(ents) == 0 || len(ents) == 1 && ents[0].Name() == "lo")
}

// ensureSysfs remounts the shared sysfs if someone unmounted it since the
// daemon started: a sandbox must not come up with an empty /sys. The check
// is one statfs per create.
func (b *Backend) ensureSysfs() error {
	var st unix.Statfs_t
	if unix.Statfs(b.sysfsDir(), &st) == nil && st.Type == unix.SYSFS_MAGIC {
		return nil
	}
	b.sharedMu.Lock()
	defer b.sharedMu.Unlock()
	return mountSharedSysfs(b.sysfsDir())
}

// Close stops the reaper (what it has not removed stays in the trash for
// the next daemon), unmounts the shared sysfs and empty tmpfs, and the
// shared devfs if no sandbox is left on it. Live sandboxes keep their
// mounts: each has its own bind of the superblock, which stays until the
// last one is gone.
func (b *Backend) Close() error {
	if b.trash != nil {
		b.trash.close()
	}
	if b.pool != nil {
		b.pool.close()
	}
	if b.netns != nil {
		b.netns.close()
	}
	if b.stage != nil {
		b.stage.Close()
	}
	if b.mon != nil {
		b.mon.close()
	}
	if b.net != nil {
		// Drops the nftables table only when no sandbox has rules in it.
		_ = b.net.RemoveUnused()
		_ = b.net.Close()
	}
	// With sandboxes left (a daemon restart, not a drain), the shared
	// filesystems they bind stay mounted for the next daemon: a new
	// mount would be another superblock, and CRIU finds a sandbox's
	// external binds by the superblock of the node's mount (a sandbox of
	// an earlier daemon could not be checkpointed).
	if ents, err := os.ReadDir(b.devfsDir()); err == nil && len(ents) > 0 {
		return nil
	}
	if err := unix.Unmount(b.sysfsDir(), unix.MNT_DETACH); err != nil && err != unix.EINVAL && err != unix.ENOENT {
		return fmt.Errorf("unmount shared sysfs: %w", err)
	}
	if err := b.closeEmpty(); err != nil {
		return err
	}
	if err := b.closeViews(); err != nil {
		return err
	}
	if err := b.closeAgentfs(); err != nil {
		return err
	}
	return b.closeDevfs()
}
