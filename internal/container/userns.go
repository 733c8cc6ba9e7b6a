package container

import (
	"fmt"
	"os"
	"path/filepath"
	"sync"

	"golang.org/x/sys/unix"

	"github.com/warrenrl/warren/internal/errdefs"
)

// The user-namespace mode (Spec.UserNS): each such sandbox gets IDsPerSandbox
// host ids of its own, root inside being the first, from the daemon's range
// (Options.UserNSIDs). The init stage makes the namespace, mounts the
// image's layers idmapped through it and joins it last (init_linux.c
// make_userns); the upper directory keeps host ids (base+N), which
// IDMap lets file calls (sandboxfs) and commit shift back.

// IDsPerSandbox is the size of a sandbox's id range: every id a Linux
// image uses (nobody is 65534).
const IDsPerSandbox = 1 << 16

// DefaultUserNSIDs is the host id range sandboxes take theirs from: 2^30
// ids from 2^31, 16,384 sandboxes, far above the ids of the node's own
// users and the usual /etc/subuid ranges (100000 + 65536 per user).
var DefaultUserNSIDs = IDRange{Start: 1 << 31, Count: 1 << 30}

// IDRange is a range of host ids.
type IDRange struct {
	Start, Count uint32
}

// String is START:COUNT, as warren serve --userns-ids takes it.
func (r IDRange) String() string { return fmt.Sprintf("%d:%d", r.Start, r.Count) }

// ParseIDRange reads START:COUNT.
func ParseIDRange(s string) (IDRange, error) {
	var r IDRange
	if _, err := fmt.Sscanf(s, "%d:%d", &r.Start, &r.Count); err != nil {
		return r, errdefs.Invalidf("bad id range %q: want START:COUNT", s)
	}
	if r.Start == 0 || r.Count < IDsPerSandbox || uint64(r.Start)+uint64(r.Count) > 1<<32-1 {
		return r, errdefs.Invalidf("bad id range %q: START above 0, COUNT at least %d, and the range below 2^32-1", s, IDsPerSandbox)
	}
	return r, nil
}

// UserNS is a sandbox's id mapping, as the daemon persists it.
type UserNS struct {
	Base uint32 `json:"base"`
	Size uint32 `json:"size"`
}

// idPool hands out sandboxes' id ranges: slot i is Start + i*IDsPerSandbox.
// A range has holders: the sandbox it was taken for, and the sandboxes
// restored from its checkpoints (CRIU restores the id map it recorded, so
// a hibernated sandbox comes back, and its forks run, with the same ids);
// it is free again once none holds it.
type idPool struct {
	r    IDRange
	mu   sync.Mutex
	used map[uint32]map[string]bool // base -> holders
	next uint32                     // the slot to try first: round robin, so a
	// freed range is the last taken again (a deleted sandbox's files may
	// still be on their way out through the reaper, and a hibernated
	// one's checkpoint holds it: docs/HIBERNATE.md).
}

func newIDPool(r IDRange) *idPool {
	if r.Count == 0 {
		r = DefaultUserNSIDs
	}
	return &idPool{r: r, used: make(map[uint32]map[string]bool)}
}

func (p *idPool) slots() uint32 { return p.r.Count / IDsPerSandbox }

// take returns a free range for sandbox id.
func (p *idPool) take(id string) (UserNS, error) {
	p.mu.Lock()
	defer p.mu.Unlock()
	n := p.slots()
	for i := uint32(0); i < n; i++ {
		slot := (p.next + i) % n
		base := p.r.Start + slot*IDsPerSandbox
		if len(p.used[base]) == 0 {
			p.used[base] = map[string]bool{id: true}
			p.next = slot + 1
			return UserNS{Base: base, Size: IDsPerSandbox}, nil
		}
	}
	return UserNS{}, errdefs.Exhaustedf("no free user-namespace id range: all %d of %s are in use (warren serve --userns-ids)", n, p.r)
}

// claim makes holder (a sandbox id, or checkpointHolder(dir)) a holder
// of u: an adopted sandbox, a checkpoint, or one restored from a
// checkpoint (which may share it with its source and the source's other
// forks).
func (p *idPool) claim(holder string, u UserNS) error {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.claimLocked(holder, u)
	return nil
}

func (p *idPool) claimLocked(holder string, u UserNS) {
	if p.used[u.Base] == nil {
		p.used[u.Base] = map[string]bool{}
	}
	p.used[u.Base][holder] = true
}

// claimFrom makes holder (sandbox id, restored from checkpoint dir, or
// the checkpoint itself, admitted from another node) a holder of the
// range the checkpoint recorded. Conflict when others hold the range
// and the checkpoint does not: it came from another node (a shared
// checkpoint directory), where this node gave the range to a sandbox of
// its own, which must not share ids with it.
func (p *idPool) claimFrom(id, dir string, u UserNS, holder string) error {
	p.mu.Lock()
	defer p.mu.Unlock()
	if h := p.used[u.Base]; len(h) > 0 && !h[checkpointHolder(dir)] {
		return errdefs.Conflictf("sandbox %s: its user-namespace id range %d-%d is in use by another sandbox on this node (a sandbox took it here, or the nodes' --userns-ids overlap)", id, u.Base, u.Base+u.Size-1)
	}
	p.claimLocked(holder, u)
	return nil
}

func (p *idPool) release(holder string, u UserNS) {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.releaseLocked(holder, u.Base)
}

func (p *idPool) releaseLocked(holder string, base uint32) {
	delete(p.used[base], holder)
	if len(p.used[base]) == 0 {
		delete(p.used, base)
	}
}

// releaseHolder releases whatever range holder holds (a checkpoint's,
// whose metadata may be gone already).
func (p *idPool) releaseHolder(holder string) {
	p.mu.Lock()
	defer p.mu.Unlock()
	for base, h := range p.used {
		if h[holder] {
			p.releaseLocked(holder, base)
		}
	}
}

// checkpointHolder is the holder name of the checkpoint in dir: a
// hibernated sandbox's range stays taken while its checkpoint exists, so
// that no new sandbox gets the ids it comes back with.
func checkpointHolder(dir string) string { return "checkpoint:" + filepath.Clean(dir) }

// shiftOwner gives a file the daemon made in a sandbox's upper directory
// to the sandbox's ids: host uid/gid N becomes base+N.
func shiftOwner(path string, u *UserNS, uid, gid int) error {
	if u == nil {
		return nil
	}
	if err := unix.Lchown(path, int(u.Base)+uid, int(u.Base)+gid); err != nil {
		return fsErr(&os.PathError{Op: "chown", Path: path, Err: err}, "sandbox upper directory")
	}
	return nil
}

// UserNSSupported says whether this kernel can run sandboxes in user
// namespaces as the init stage builds them: idmapped mounts (5.12) of the
// layers' filesystems, and overlayfs taking detached mounts as layers
// (6.15). On an older kernel the daemon leaves the mode off by default.
func UserNSSupported() error {
	var u unix.Utsname
	if err := unix.Uname(&u); err != nil {
		return err
	}
	rel := unix.ByteSliceToString(u.Release[:])
	var major, minor int
	if _, err := fmt.Sscanf(rel, "%d.%d", &major, &minor); err != nil {
		return fmt.Errorf("kernel release %q: %w", rel, err)
	}
	if major < 6 || major == 6 && minor < 15 {
		return errdefs.Unsupportedf("kernel %s: sandboxes in user namespaces need Linux 6.15 (overlayfs layers from detached idmapped mounts)", rel)
	}
	return nil
}
