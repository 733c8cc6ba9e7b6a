package sandboxfs

import (
	"runtime"

	"golang.org/x/sys/unix"
)

// IDMap is a sandbox's user-namespace mapping: ids 0..Size-1 inside are
// Base.. on the host (and in its writable layer, which keeps host ids).
type IDMap struct {
	Base, Size uint32
}

// NewMapped returns an FS for the root of a sandbox in a user namespace:
// what it creates belongs to the sandbox's root (host id m.Base), not to
// the daemon's, which the sandbox would see as the overflow id.
func NewMapped(root string, m IDMap) *FS { return &FS{root: root, ids: &m} }

// asSandboxRoot runs fn, which creates files, with the calling thread's
// filesystem ids set to the sandbox's root, so that every file and
// directory it makes is owned by root inside. The daemon keeps its
// capabilities (the kernel drops the filesystem ones from the effective
// set when the fsuid leaves 0; they are raised again from the permitted
// set), so permission checks stay the daemon's. The ids are per thread:
// the goroutine stays on its thread until they are back, and a thread
// whose ids could not be restored is never handed back to the scheduler
// (it exits with the goroutine).
func (f *FS) asSandboxRoot(fn func() error) error {
	if f.ids == nil {
		return fn()
	}
	runtime.LockOSThread()
	id := int(f.ids.Base)
	// setfsuid reports the previous id, never an error; it is checked by
	// reading it back (a second call with -1 changes nothing).
	unix.Setfsgid(id)
	unix.Setfsuid(id)
	restored := false
	defer func() {
		if restored {
			runtime.UnlockOSThread()
		}
	}()
	if err := raiseEffective(); err != nil {
		restored = resetFSIDs()
		return err
	}
	err := fn()
	restored = resetFSIDs()
	return err
}

// resetFSIDs gives the thread the daemon's filesystem ids (0) back, which
// also restores the filesystem capabilities, and reports whether it did.
func resetFSIDs() bool {
	unix.Setfsuid(0)
	unix.Setfsgid(0)
	u, _ := unix.SetfsuidRetUid(-1)
	g, _ := unix.SetfsgidRetGid(-1)
	return u == 0 && g == 0
}

// raiseEffective makes the thread's effective capabilities its permitted
// ones.
func raiseEffective() error {
	hdr := unix.CapUserHeader{Version: unix.LINUX_CAPABILITY_VERSION_3}
	var data [2]unix.CapUserData
	if err := unix.Capget(&hdr, &data[0]); err != nil {
		return err
	}
	data[0].Effective, data[1].Effective = data[0].Permitted, data[1].Permitted
	return unix.Capset(&hdr, &data[0])
}

// mapID is how archives show owners: nil (as they are) without a user
// namespace.
func (f *FS) mapID() func(uint32) uint32 {
	if f.ids == nil {
		return nil
	}
	return f.ids.hostToSandbox
}

// hostToSandbox is the id a sandbox sees for host id id: shifted into its
// range, or the overflow id (65534) for one outside it.
func (m *IDMap) hostToSandbox(id uint32) uint32 {
	if m == nil {
		return id
	}
	if id >= m.Base && id-m.Base < m.Size {
		return id - m.Base
	}
	return 65534
}
