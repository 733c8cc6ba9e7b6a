package container

import (
	"bytes"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"sync"

	"golang.org/x/sys/unix"
)

// CRIU's kernel data cache.
//
// Every CRIU run probes the kernel first (kerndat: ~15-25 ms here, of a
// restore of ~70 ms when its memory comes lazily), unless it finds the
// result of an earlier run in /run/criu.kdat. It keeps that file only on
// a tmpfs (a reboot, which may bring another kernel, empties it), and
// checks nothing of it but its size and two magic numbers. These nodes'
// /run is no tmpfs.
//
// So each CRIU process the backend starts is started from a thread of
// its own in a private mount namespace (a copy of the daemon's, a slave
// of it, so nothing done there reaches the node) whose /run is a small
// tmpfs holding the cache, with every entry of the node's /run bound back
// at its place (a CRIU run must see the daemon's directories wherever
// they are). The cache is the daemon's, in memory only: made once per
// daemon (warmKdat: `criu check` run in such a namespace, the file it left
// read back) and used only while the boot, the CRIU binary and the kernel
// it was made under are the running ones (kdatKey).

// kdatCache is the daemon's copy of /run/criu.kdat.
var kdatCache struct {
	mu   sync.Mutex
	key  string
	data []byte
	warm sync.Once
}

// kdatKey names what the cache is valid for: this boot (a kernel changes
// only with one), and CRIU's binaries as installed now.
func kdatKey() string {
	boot, _ := os.ReadFile("/proc/sys/kernel/random/boot_id")
	var uts unix.Utsname
	_ = unix.Uname(&uts)
	key := string(bytes.TrimSpace(boot)) + "|" + unix.ByteSliceToString(uts.Release[:])
	for _, p := range []string{CRIUPath, filepath.Join(CRIUPrefix, "usr/sbin/criu")} {
		var st unix.Stat_t
		if unix.Stat(p, &st) == nil {
			key += fmt.Sprintf("|%s:%d:%d.%d:%d", p, st.Size, st.Mtim.Sec, st.Mtim.Nsec, st.Ino)
		}
	}
	return key
}

// currentKdat is the cache if it is valid for the running node, else nil.
func currentKdat() []byte {
	key := kdatKey()
	kdatCache.mu.Lock()
	defer kdatCache.mu.Unlock()
	if kdatCache.key != key {
		kdatCache.data = nil
	}
	return kdatCache.data
}

// warmKdat makes the cache, once per daemon, in the background: until it
// is there CRIU probes as before.
func warmKdat() {
	kdatCache.warm.Do(func() {
		go func() {
			key := kdatKey()
			var data []byte
			err := withCRIUMounts(nil, func() error {
				// Probes the kernel and keeps the result in the tmpfs /run
				// this thread sees.
				_ = exec.Command(CRIUPath, "check").Run()
				var err error
				data, err = os.ReadFile("/run/criu.kdat")
				return err
			})
			if err != nil || len(data) == 0 {
				return
			}
			kdatCache.mu.Lock()
			kdatCache.key, kdatCache.data = key, data
			kdatCache.mu.Unlock()
		}()
	})
}

// startCRIU runs start, which starts a CRIU process, from a thread in a
// private mount namespace whose /run holds the kernel data cache (see
// above). Where that namespace cannot be made, start runs as before,
// from the daemon's namespace: CRIU then probes the kernel itself.
func startCRIU(start func() error) error {
	warmKdat()
	data := currentKdat()
	if data == nil {
		return start()
	}
	err := withCRIUMounts(data, start)
	if errors.Is(err, errNoCRIUMounts) {
		return start()
	}
	return err
}

var errNoCRIUMounts = errors.New("no private mount namespace for CRIU")

// withCRIUMounts runs fn on a thread of its own (throwawayThread: never
// the main thread, whose namespaces /proc/self shows) in a new mount
// namespace whose /run is a tmpfs with kdat (if any) as criu.kdat and the
// node's /run entries bound back; the thread ends with fn. A failure to
// make the namespace is errNoCRIUMounts, and fn did not run.
func withCRIUMounts(kdat []byte, fn func() error) error {
	return throwawayThread(func() error {
		if err := privateRun(kdat); err != nil {
			return fmt.Errorf("%w: %v", errNoCRIUMounts, err)
		}
		return fn()
	})
}

// privateRun unshares this thread's mount namespace and mounts the tmpfs
// /run; the node's /run is untouched.
func privateRun(kdat []byte) error {
	if err := unix.Unshare(unix.CLONE_NEWNS); err != nil {
		return fmt.Errorf("unshare: %w", err)
	}
	// Nothing mounted here propagates to the node; what the daemon mounts
	// later (nothing a started CRIU needs) may propagate in.
	if err := unix.Mount("", "/", "", unix.MS_REC|unix.MS_SLAVE, ""); err != nil {
		return fmt.Errorf("make / a slave: %w", err)
	}
	ents, err := os.ReadDir("/run")
	if err != nil {
		return err
	}
	// Copies of every entry of the node's /run (with their mounts),
	// taken before the tmpfs covers them.
	type entry struct {
		name   string
		fd     int
		dir    bool
		target string // a symlink's
	}
	var keep []entry
	defer func() {
		for _, e := range keep {
			if e.fd >= 0 {
				unix.Close(e.fd)
			}
		}
	}()
	for _, e := range ents {
		p := filepath.Join("/run", e.Name())
		if e.Name() == "criu.kdat" || e.Name() == "criu.kdat.tmp" {
			// The node's own (another CRIU's leftovers: a stale
			// criu.kdat.tmp stops CRIU from saving its cache).
			continue
		}
		if e.Type()&os.ModeSymlink != 0 {
			t, err := os.Readlink(p)
			if err != nil {
				return err
			}
			keep = append(keep, entry{name: e.Name(), fd: -1, target: t})
			continue
		}
		fd, err := unix.OpenTree(unix.AT_FDCWD, p, unix.OPEN_TREE_CLONE|unix.OPEN_TREE_CLOEXEC|unix.AT_RECURSIVE|unix.AT_SYMLINK_NOFOLLOW)
		if err != nil {
			return fmt.Errorf("clone %s: %w", p, err)
		}
		keep = append(keep, entry{name: e.Name(), fd: fd, dir: e.IsDir()})
	}
	if err := unix.Mount("warren-criu-run", "/run", "tmpfs", unix.MS_NOSUID|unix.MS_NODEV, "mode=0755,size=4m"); err != nil {
		return fmt.Errorf("mount tmpfs /run: %w", err)
	}
	for _, e := range keep {
		p := filepath.Join("/run", e.name)
		switch {
		case e.fd < 0:
			if err := os.Symlink(e.target, p); err != nil {
				return err
			}
			continue
		case e.dir:
			if err := unix.Mkdir(p, 0o755); err != nil {
				return err
			}
		default:
			f, err := os.OpenFile(p, os.O_CREATE|os.O_WRONLY, 0o600)
			if err != nil {
				return err
			}
			f.Close()
		}
		if err := unix.MoveMount(e.fd, "", unix.AT_FDCWD, p, unix.MOVE_MOUNT_F_EMPTY_PATH); err != nil {
			return fmt.Errorf("bind %s back: %w", p, err)
		}
	}
	if kdat != nil {
		if err := os.WriteFile("/run/criu.kdat", kdat, 0o600); err != nil {
			return err
		}
	}
	return nil
}

// reopenDir opens path again in the calling thread's mount namespace and
// puts it in f's place (its number, without close-on-exec, as a
// descriptor passed to CRIU is): a directory the daemon opened names a
// mount of its own namespace, where CRIU in another cannot mount.
func reopenDir(f *os.File, path string) error {
	fd, err := unix.Open(path, unix.O_RDONLY|unix.O_DIRECTORY|unix.O_CLOEXEC, 0)
	if err != nil {
		return err
	}
	defer unix.Close(fd)
	return unix.Dup3(fd, int(f.Fd()), 0)
}
