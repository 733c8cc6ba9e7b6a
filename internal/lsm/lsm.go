// Package lsm is Warren's BPF LSM policy: small eBPF programs attached to
// kernel security hooks that refuse, for processes in a sandbox's cgroup
// only, what a sandbox must never do, and report each refusal with the
// sandbox's cgroup id. It is a second wall behind the seccomp filter
// (internal/seccomp): it holds where a filter cannot look (a module load
// the kernel requests on a sandbox's behalf, an ioctl reached through a
// path the filter allows) and it names the sandbox of every refusal
// exactly, where the kernel's audit record names only a pid.
//
// Sandboxes are keyed by the id of their cgroup on the unified (v2)
// hierarchy, which is what bpf_get_current_cgroup_id returns: on v2 and on
// the hybrid layout every sandbox has a group there; on pure v1 there is
// none and the policy is not loaded.
//
// Not wired into the daemon yet: the kernels this project is tested on
// refuse to load LSM programs (docs/SECURITY.md), so nothing here has
// been through the verifier; the test runs where a kernel allows it.
//
// The programs are written with cilium/ebpf's assembler (no C compiler,
// no generated objects): each is a few comparisons that let every call
// of the node through at once unless it is one the policy refuses, and
// only then looks the caller's cgroup up.
package lsm

import (
	"encoding/binary"
	"errors"
	"fmt"
	"os"
	"strings"
	"sync"

	"github.com/cilium/ebpf"
	"github.com/cilium/ebpf/asm"
	"github.com/cilium/ebpf/link"
	"github.com/cilium/ebpf/ringbuf"
	"github.com/cilium/ebpf/rlimit"
	"golang.org/x/sys/unix"

	"github.com/warrenrl/warren/internal/seccomp"
)

// Hook identifies the security hook that refused.
type Hook uint32

const (
	HookModuleRequest Hook = 1 + iota // kernel_module_request: a module load on the sandbox's behalf
	HookIoctl                         // file_ioctl: a filesystem-metadata or terminal ioctl
	HookSocket                        // socket_create: an address family a sandbox may not use
	HookMount                         // sb_mount, move_mount: any mount
)

func (h Hook) String() string {
	switch h {
	case HookModuleRequest:
		return "module_request"
	case HookIoctl:
		return "ioctl"
	case HookSocket:
		return "socket"
	case HookMount:
		return "mount"
	}
	return fmt.Sprintf("hook %d", uint32(h))
}

// Event is one refusal.
type Event struct {
	CgroupID uint64
	Hook     Hook
	Arg      uint64 // the ioctl command, the address family; 0 for the others
	Name     string // the module the kernel was asked to load
}

func (e Event) String() string {
	switch e.Hook {
	case HookModuleRequest:
		return fmt.Sprintf("%v %q refused", e.Hook, e.Name)
	case HookIoctl:
		return fmt.Sprintf("ioctl %#x refused", e.Arg)
	case HookSocket:
		return fmt.Sprintf("socket family %d refused", e.Arg)
	}
	return e.Hook.String() + " refused"
}

// Stack layout of every program: the map key at -8, the event (40
// bytes: cgroup id, hook, pad, arg, 16 bytes of name) from -56.
const (
	keyOff   = -8
	evOff    = -56
	evSize   = 40
	nameOff  = evOff + 24
	nameSize = 16
	afVsock  = 40
	ePerm    = -1
)

// Guard holds the loaded programs, their links and the maps.
type Guard struct {
	sandboxes *ebpf.Map // cgroup id -> 1
	events    *ebpf.Map // ring buffer of refusals
	progs     []*ebpf.Program
	links     []link.Link
	rd        *ringbuf.Reader
	closeOnce sync.Once
}

// ErrUnsupported says the node cannot run the policy: no BPF LSM active,
// or no unified cgroup hierarchy to key sandboxes by.
var ErrUnsupported = errors.New("BPF LSM policy unsupported")

// Available says whether the kernel runs the BPF LSM (it is listed in
// the securityfs lsm file, or the boot's lsm= names it).
func Available() error {
	for _, p := range []string{"/sys/kernel/security/lsm"} {
		if b, err := os.ReadFile(p); err == nil {
			if !strings.Contains(","+strings.TrimSpace(string(b))+",", ",bpf,") {
				return fmt.Errorf("%w: the active LSMs are %q, without bpf (boot with lsm=...,bpf)", ErrUnsupported, strings.TrimSpace(string(b)))
			}
			return nil
		}
	}
	if b, err := os.ReadFile("/proc/cmdline"); err == nil && strings.Contains(string(b), "lsm=") {
		for _, f := range strings.Fields(string(b)) {
			if v, ok := strings.CutPrefix(f, "lsm="); ok && strings.Contains(","+v+",", ",bpf,") {
				return nil
			}
		}
		return fmt.Errorf("%w: lsm= on the kernel command line does not name bpf", ErrUnsupported)
	}
	// No securityfs to ask: loading tells.
	return nil
}

// Load loads and attaches the policy. It applies to no process until
// Add names a sandbox's cgroup.
func Load() (_ *Guard, err error) {
	if err := Available(); err != nil {
		return nil, err
	}
	_ = rlimit.RemoveMemlock() // kernels before 5.11 charge maps to RLIMIT_MEMLOCK
	g := &Guard{}
	defer func() {
		if err != nil {
			g.Close()
		}
	}()
	if g.sandboxes, err = ebpf.NewMap(&ebpf.MapSpec{Name: "warren_sandboxes", Type: ebpf.Hash, KeySize: 8, ValueSize: 4, MaxEntries: 65536}); err != nil {
		return nil, fmt.Errorf("lsm: sandbox map: %w", err)
	}
	if g.events, err = ebpf.NewMap(&ebpf.MapSpec{Name: "warren_lsm_ev", Type: ebpf.RingBuf, MaxEntries: 256 << 10}); err != nil {
		return nil, fmt.Errorf("lsm: event ring: %w", err)
	}
	for _, p := range g.programs() {
		prog, err := ebpf.NewProgram(&ebpf.ProgramSpec{
			Name: "warren_" + p.hook, Type: ebpf.LSM, AttachType: ebpf.AttachLSMMac, AttachTo: p.hook,
			Instructions: p.insns, License: "GPL",
		})
		if err != nil {
			// EPERM before the verifier: some kernels (this project's CI
			// VMs, 6.18 with lockdown=integrity) refuse every LSM and
			// fentry program to root with CAP_BPF and CAP_PERFMON.
			if errors.Is(err, ebpf.ErrNotSupported) || errors.Is(err, unix.EPERM) {
				return nil, fmt.Errorf("%w: the kernel refuses to load an LSM program for %s: %v", ErrUnsupported, p.hook, err)
			}
			return nil, fmt.Errorf("lsm: load %s: %w", p.hook, err)
		}
		g.progs = append(g.progs, prog)
		l, err := link.AttachLSM(link.LSMOptions{Program: prog})
		if err != nil {
			return nil, fmt.Errorf("lsm: attach %s: %w", p.hook, err)
		}
		g.links = append(g.links, l)
	}
	if g.rd, err = ringbuf.NewReader(g.events); err != nil {
		return nil, fmt.Errorf("lsm: event reader: %w", err)
	}
	return g, nil
}

// Add puts the processes of the cgroup with this id under the policy.
func (g *Guard) Add(cgroupID uint64) error {
	return g.sandboxes.Update(cgroupID, uint32(1), ebpf.UpdateAny)
}

// Remove takes a cgroup id out of the policy (its sandbox is gone).
func (g *Guard) Remove(cgroupID uint64) error {
	err := g.sandboxes.Delete(cgroupID)
	if errors.Is(err, ebpf.ErrKeyNotExist) {
		return nil
	}
	return err
}

// Read blocks for the next refusal; it fails once the guard is closed.
func (g *Guard) Read() (Event, error) {
	rec, err := g.rd.Read()
	if err != nil {
		return Event{}, err
	}
	b := rec.RawSample
	if len(b) < evSize {
		return Event{}, fmt.Errorf("lsm: short event (%d bytes)", len(b))
	}
	ev := Event{
		CgroupID: binary.NativeEndian.Uint64(b[0:]),
		Hook:     Hook(binary.NativeEndian.Uint32(b[8:])),
		Arg:      binary.NativeEndian.Uint64(b[16:]),
	}
	name := b[24 : 24+nameSize]
	if i := strings.IndexByte(string(name), 0); i >= 0 {
		name = name[:i]
	}
	ev.Name = string(name)
	return ev, nil
}

// Close detaches the programs: the policy ends with the daemon, and the
// next daemon loads it again before it adopts its sandboxes.
func (g *Guard) Close() {
	g.closeOnce.Do(func() {
		if g.rd != nil {
			g.rd.Close()
		}
		for _, l := range g.links {
			l.Close()
		}
		for _, p := range g.progs {
			p.Close()
		}
		if g.sandboxes != nil {
			g.sandboxes.Close()
		}
		if g.events != nil {
			g.events.Close()
		}
	})
}

// CgroupID is the id bpf_get_current_cgroup_id returns for processes in
// the unified-hierarchy cgroup at dir: its directory's inode number.
func CgroupID(dir string) (uint64, error) {
	var st unix.Stat_t
	if err := unix.Stat(dir, &st); err != nil {
		return 0, err
	}
	return st.Ino, nil
}

type program struct {
	hook  string
	insns asm.Instructions
}

// programs are the policy: for each hook, the test of its arguments
// (jumping to "check" when the call is one to refuse), then the shared
// tail that refuses it for sandboxes only.
func (g *Guard) programs() []program {
	ioctl := asm.Instructions{
		asm.LoadMem(asm.R7, asm.R6, 8, asm.DWord), // cmd
		asm.And.Imm(asm.R7, 0xffff),
	}
	for _, cmd := range seccomp.DeniedIoctls() {
		ioctl = append(ioctl, asm.JEq.Imm(asm.R7, int32(cmd), "check"))
	}
	ioctl = append(ioctl, asm.Ja.Label("allow"))
	return []program{
		{"file_ioctl", g.refuse(HookIoctl, ioctl, false)},
		{"socket_create", g.refuse(HookSocket, asm.Instructions{
			asm.LoadMem(asm.R8, asm.R6, 24, asm.DWord), // kern: the kernel's own sockets pass
			asm.JNE.Imm(asm.R8, 0, "allow"),
			asm.LoadMem(asm.R7, asm.R6, 0, asm.DWord), // family
			asm.JEq.Imm32(asm.R7, afVsock, "check"),
			asm.Ja.Label("allow"),
		}, false)},
		{"kernel_module_request", g.refuse(HookModuleRequest, asm.Instructions{
			asm.Mov.Imm(asm.R7, 0),
			asm.Ja.Label("check"),
		}, true)},
		{"sb_mount", g.refuse(HookMount, asm.Instructions{asm.Mov.Imm(asm.R7, 0), asm.Ja.Label("check")}, false)},
		{"move_mount", g.refuse(HookMount, asm.Instructions{asm.Mov.Imm(asm.R7, 0), asm.Ja.Label("check")}, false)},
	}
}

// refuse wraps test (which reads the hook's arguments from the context
// in R6, leaves the event's arg in R7, and jumps to "check" or "allow")
// with the lookup of the caller's cgroup and the refusal: an event and
// -EPERM for a sandbox, 0 for anyone else. withName copies the string
// the hook's first argument points to (the module name) into the event.
func (g *Guard) refuse(hook Hook, test asm.Instructions, withName bool) asm.Instructions {
	insns := asm.Instructions{asm.Mov.Reg(asm.R6, asm.R1)}
	insns = append(insns, test...)
	insns = append(insns,
		asm.FnGetCurrentCgroupId.Call().WithSymbol("check"),
		asm.StoreMem(asm.RFP, keyOff, asm.R0, asm.DWord),
		asm.LoadMapPtr(asm.R1, g.sandboxes.FD()),
		asm.Mov.Reg(asm.R2, asm.RFP),
		asm.Add.Imm(asm.R2, keyOff),
		asm.FnMapLookupElem.Call(),
		asm.JEq.Imm(asm.R0, 0, "allow"),
		// The event: cgroup id, hook, arg, name.
		asm.LoadMem(asm.R1, asm.RFP, keyOff, asm.DWord),
		asm.StoreMem(asm.RFP, evOff, asm.R1, asm.DWord),
		asm.StoreImm(asm.RFP, evOff+8, int64(hook), asm.Word),
		asm.StoreImm(asm.RFP, evOff+12, 0, asm.Word),
		asm.StoreMem(asm.RFP, evOff+16, asm.R7, asm.DWord),
		asm.StoreImm(asm.RFP, nameOff, 0, asm.DWord),
		asm.StoreImm(asm.RFP, nameOff+8, 0, asm.DWord),
	)
	if withName {
		insns = append(insns,
			asm.Mov.Reg(asm.R1, asm.RFP),
			asm.Add.Imm(asm.R1, nameOff),
			asm.Mov.Imm(asm.R2, nameSize),
			asm.LoadMem(asm.R3, asm.R6, 0, asm.DWord),
			asm.FnProbeReadKernelStr.Call(),
		)
	}
	return append(insns,
		asm.LoadMapPtr(asm.R1, g.events.FD()),
		asm.Mov.Reg(asm.R2, asm.RFP),
		asm.Add.Imm(asm.R2, evOff),
		asm.Mov.Imm(asm.R3, evSize),
		asm.Mov.Imm(asm.R4, 0),
		asm.FnRingbufOutput.Call(),
		asm.Mov.Imm(asm.R0, ePerm),
		asm.Return(),
		asm.Mov.Imm(asm.R0, 0).WithSymbol("allow"),
		asm.Return(),
	)
}
