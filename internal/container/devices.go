package container

import (
	"errors"
	"os"
	"path"
	"path/filepath"
	"slices"
	"strings"

	"golang.org/x/sys/unix"

	"github.com/warrenrl/warren/internal/backend"
	"github.com/warrenrl/warren/internal/errdefs"
)

// Extra device nodes and read-only binds: what a GPU environment of the
// fncall backend gets (backend.Spec.Devices, Mounts; SetDevices per job).
// Both are made from the node's side once the init stage is done, without
// a change to it: a device node is made in the sandbox's /dev directory on
// the shared devfs tmpfs (devfs.go), which the sandbox sees through its
// bind; a bind enters the sandbox's mount namespace as rebind does.
//
// Which nodes a sandbox may open is decided by what its /dev holds: its
// processes hold no CAP_MKNOD, so they cannot make another. The devices
// cgroup (v1, hybrid) allows the node's configured devices to every
// sandbox (Options.Devices); v2 has no device filter here (cgroups.New).

// checkDevices validates extra device nodes: plain names that are not one
// of the standard entries.
func checkDevices(devs []backend.Device) error {
	for _, d := range devs {
		if d.Name == "" || strings.ContainsAny(d.Name, "/\x00") || d.Name == "." || d.Name == ".." || slices.Contains(devEntries, d.Name) || slices.Contains(devEntries, d.Name+"/") {
			return errdefs.Invalidf("device node name %q: a plain name that is not a standard /dev entry", d.Name)
		}
	}
	return nil
}

// makeDevices makes devs in dir (a sandbox's /dev on the host), readable
// and writable by every user of the sandbox, as its standard nodes are.
func makeDevices(dir string, devs []backend.Device) error {
	for _, d := range devs {
		p := filepath.Join(dir, d.Name)
		if err := unix.Mknod(p, unix.S_IFCHR|0o666, int(unix.Mkdev(d.Major, d.Minor))); err != nil {
			return errdefs.Wrap(errdefs.Internal, err, "mknod "+p)
		}
		// The daemon's umask narrowed the mode.
		if err := unix.Chmod(p, 0o666); err != nil {
			return errdefs.Wrap(errdefs.Internal, err, "chmod "+p)
		}
	}
	return nil
}

// extras makes a new sandbox's extra device nodes and binds.
func (s *sandbox) extras(spec backend.Spec) error {
	if err := makeDevices(s.b.devDir(s.id), spec.Devices); err != nil {
		return err
	}
	if len(spec.Mounts) == 0 {
		return nil
	}
	return bindMounts(s.st.Pid, spec.Mounts)
}

// SetDevices replaces the sandbox's per-job device nodes
// (backend.DeviceSetter).
func (s *sandbox) SetDevices(devs []backend.Device) error {
	if err := checkDevices(devs); err != nil {
		return err
	}
	s.devMu.Lock()
	defer s.devMu.Unlock()
	dir := s.b.devDir(s.id)
	for _, name := range s.devs {
		if err := unix.Unlink(filepath.Join(dir, name)); err != nil && err != unix.ENOENT {
			return errdefs.Wrap(errdefs.Internal, err, "remove device node "+name)
		}
	}
	s.devs = nil
	if err := makeDevices(dir, devs); err != nil {
		for _, d := range devs {
			_ = unix.Unlink(filepath.Join(dir, d.Name))
		}
		return err
	}
	for _, d := range devs {
		s.devs = append(s.devs, d.Name)
	}
	return nil
}

var _ backend.DeviceSetter = (*sandbox)(nil)

// checkMounts validates read-only binds: an existing source, and an
// absolute, clean target below the root.
func checkMounts(ms []backend.Mount) error {
	for _, m := range ms {
		if m.Target == "" || m.Target[0] != '/' || path.Clean(m.Target) != m.Target || m.Target == "/" || strings.Contains(m.Target, "\x00") {
			return errdefs.Invalidf("mount target %q: an absolute, clean path below /", m.Target)
		}
		if _, err := os.Stat(m.Source); err != nil {
			return errdefs.Wrap(errdefs.Invalid, err, "mount source")
		}
	}
	return nil
}

// bindMounts binds each mount's source read-only (nosuid, nodev, but
// executable: libraries are mapped executable, tools run) at its target
// in the mount namespace of init pid, making the target (an empty file
// or directory, parents 0755) where the image lacks it. The targets are
// made inside the namespace, where the sandbox's symlinks resolve within
// its own root.
func bindMounts(initPid int, ms []backend.Mount) error {
	trees := make([]int, 0, len(ms))
	dirs := make([]bool, 0, len(ms))
	defer func() {
		for _, t := range trees {
			unix.Close(t)
		}
	}()
	for _, m := range ms {
		st, err := os.Stat(m.Source)
		if err != nil {
			return errdefs.Wrap(errdefs.Invalid, err, "mount source")
		}
		t, err := unix.OpenTree(unix.AT_FDCWD, m.Source, unix.OPEN_TREE_CLONE|unix.OPEN_TREE_CLOEXEC)
		if err != nil {
			return errdefs.Wrap(errdefs.Internal, err, "open_tree "+m.Source)
		}
		trees = append(trees, t)
		dirs = append(dirs, st.IsDir())
		attr := unix.MountAttr{Attr_set: unix.MOUNT_ATTR_RDONLY | unix.MOUNT_ATTR_NOSUID | unix.MOUNT_ATTR_NODEV}
		if err := unix.MountSetattr(t, "", unix.AT_EMPTY_PATH, &attr); err != nil {
			return errdefs.Wrap(errdefs.Internal, err, "mount_setattr "+m.Source)
		}
	}
	sm, err := openSandboxMounts(initPid)
	if err != nil {
		return errdefs.Wrap(errdefs.NotFound, err, "sandbox mount namespace")
	}
	defer sm.close()
	return throwawayThread(func() error {
		if err := sm.enter(); err != nil {
			return errdefs.Wrap(errdefs.Internal, err, "bind mounts")
		}
		unix.Umask(0o022)
		for i, m := range ms {
			if err := mountPoint(m.Target, dirs[i]); err != nil {
				return err
			}
			if err := unix.MoveMount(trees[i], "", unix.AT_FDCWD, m.Target, unix.MOVE_MOUNT_F_EMPTY_PATH); err != nil {
				return errdefs.Wrap(errdefs.Internal, err, "move_mount "+m.Target)
			}
		}
		return nil
	})
}

// mountPoint makes target (a directory, or an empty file) and its
// parents unless they exist.
func mountPoint(target string, dir bool) error {
	if err := os.MkdirAll(path.Dir(target), 0o755); err != nil {
		return errdefs.Wrap(errdefs.Internal, err, "make mount point")
	}
	if dir {
		if err := os.Mkdir(target, 0o755); err != nil && !errors.Is(err, os.ErrExist) {
			return errdefs.Wrap(errdefs.Internal, err, "make mount point")
		}
		return nil
	}
	f, err := os.OpenFile(target, os.O_RDONLY|os.O_CREATE, 0o644)
	if err != nil {
		return errdefs.Wrap(errdefs.Internal, err, "make mount point")
	}
	return f.Close()
}
