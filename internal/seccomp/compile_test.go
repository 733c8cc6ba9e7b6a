package seccomp

import (
	"encoding/binary"
	"syscall"
	"testing"

	"golang.org/x/net/bpf"
	"golang.org/x/sys/unix"
)

// call is one seccomp_data as the filter sees it.
type call struct {
	arch uint32
	nr   uint32
	args [6]uint64
}

// verdict runs prog on c in x/net/bpf's interpreter. The interpreter
// loads words big-endian (network order), the kernel in the machine's
// order: each 32-bit word is laid out big-endian at the offset where the
// kernel's little-endian seccomp_data has it.
func verdict(t *testing.T, prog []bpf.Instruction, c call) Action {
	t.Helper()
	vm, err := bpf.NewVM(prog)
	if err != nil {
		t.Fatalf("program rejected: %v", err)
	}
	data := make([]byte, 64)
	binary.BigEndian.PutUint32(data[offNr:], c.nr)
	binary.BigEndian.PutUint32(data[offArch:], c.arch)
	for i, a := range c.args {
		binary.BigEndian.PutUint32(data[offArgs+8*i:], uint32(a))
		binary.BigEndian.PutUint32(data[offArgs+8*i+4:], uint32(a>>32))
	}
	n, err := vm.Run(data)
	if err != nil {
		t.Fatalf("run: %v", err)
	}
	return Action(uint32(n))
}

func defaultProgram(t *testing.T) (*Policy, []bpf.Instruction) {
	t.Helper()
	p, err := DefaultPolicy()
	if err != nil {
		t.Fatal(err)
	}
	prog, err := p.Compile()
	if err != nil {
		t.Fatal(err)
	}
	if _, err := Encode(prog); err != nil {
		t.Fatal(err)
	}
	return p, prog
}

// TestEveryNumberGetsItsRule checks the binary search against the policy
// table for every call number up to past the highest rule: a search that
// lands in the wrong span gives some call another call's verdict.
func TestEveryNumberGetsItsRule(t *testing.T) {
	p, prog := defaultProgram(t)
	t.Logf("%d rules, %d instructions", len(p.Rules), len(prog))
	for nr := uint32(0); nr < 1100; nr++ {
		want := p.Default
		r, ok := p.Rules[nr]
		if ok {
			want = r.Action
		}
		if got := verdict(t, prog, call{arch: p.Arch, nr: nr}); got != want {
			t.Errorf("call %d: %v, want %v", nr, got, want)
		}
	}
	for _, nr := range []uint32{0x40000000, 0x40000000 | uint32(unix.SYS_READ), 0xffffffff} {
		if got := verdict(t, prog, call{arch: p.Arch, nr: nr}); got != p.Default {
			t.Errorf("call %#x (x32 or out of range): %v, want %v", nr, got, p.Default)
		}
	}
}

func TestArgumentChecks(t *testing.T) {
	p, prog := defaultProgram(t)
	eperm, enosys := Errno(unix.EPERM), Errno(unix.ENOSYS)
	for _, tc := range []struct {
		name string
		c    call
		want Action
	}{
		{"ioctl FICLONE", call{nr: unix.SYS_IOCTL, args: [6]uint64{3, 0x40049409}}, Errno(unix.EOPNOTSUPP)},
		{"ioctl FICLONE, high bits set", call{nr: unix.SYS_IOCTL, args: [6]uint64{3, 0xdeadbeef40049409}}, Errno(unix.EOPNOTSUPP)},
		{"ioctl FS_IOC_SETFLAGS", call{nr: unix.SYS_IOCTL, args: [6]uint64{3, 0x40086602}}, eperm},
		{"ioctl FS_IOC32_SETFLAGS", call{nr: unix.SYS_IOCTL, args: [6]uint64{3, 0x40046602}}, eperm},
		{"ioctl XFS_IOC_SWAPEXT", call{nr: unix.SYS_IOCTL, args: [6]uint64{3, 0xc0c0586d}}, eperm},
		{"ioctl EXT4_IOC_MOVE_EXT", call{nr: unix.SYS_IOCTL, args: [6]uint64{3, 0xc028660f}}, eperm},
		{"ioctl TIOCSTI", call{nr: unix.SYS_IOCTL, args: [6]uint64{0, 0x5412}}, eperm},
		{"ioctl FS_IOC_GETFLAGS", call{nr: unix.SYS_IOCTL, args: [6]uint64{3, 0x80086601}}, Allow},
		{"ioctl TCGETS", call{nr: unix.SYS_IOCTL, args: [6]uint64{0, 0x5401}}, Allow},
		{"ioctl FIONREAD", call{nr: unix.SYS_IOCTL, args: [6]uint64{0, 0x541b}}, Allow},
		{"clone thread", call{nr: unix.SYS_CLONE, args: [6]uint64{0x3d0f00}}, Allow},
		{"clone fork", call{nr: unix.SYS_CLONE, args: [6]uint64{0x1200011}}, Allow},
		{"clone new user ns", call{nr: unix.SYS_CLONE, args: [6]uint64{cloneNewUser | 17}}, eperm},
		{"clone new net ns", call{nr: unix.SYS_CLONE, args: [6]uint64{cloneNewNet}}, eperm},
		{"clone3", call{nr: unix.SYS_CLONE3}, enosys},
		{"unshare files", call{nr: unix.SYS_UNSHARE, args: [6]uint64{unix.CLONE_FILES}}, Allow},
		{"unshare user ns", call{nr: unix.SYS_UNSHARE, args: [6]uint64{cloneNewUser}}, eperm},
		{"unshare time ns", call{nr: unix.SYS_UNSHARE, args: [6]uint64{cloneNewTime}}, eperm},
		{"socket inet", call{nr: unix.SYS_SOCKET, args: [6]uint64{unix.AF_INET, unix.SOCK_STREAM}}, Allow},
		{"socket vsock", call{nr: unix.SYS_SOCKET, args: [6]uint64{unix.AF_VSOCK, unix.SOCK_STREAM}}, Errno(unix.EAFNOSUPPORT)},
		{"socket vsock, high bits set", call{nr: unix.SYS_SOCKET, args: [6]uint64{1<<32 | unix.AF_VSOCK}}, Errno(unix.EAFNOSUPPORT)},
		{"sync", call{nr: unix.SYS_SYNC}, Errno(0)},
		{"bpf", call{nr: unix.SYS_BPF}, eperm},
		{"read", call{nr: unix.SYS_READ}, Allow},
	} {
		tc.c.arch = p.Arch
		if got := verdict(t, prog, tc.c); got != tc.want {
			t.Errorf("%s: %v, want %v", tc.name, got, tc.want)
		}
	}
	if got := verdict(t, prog, call{arch: 0x40000003 /* i386 */, nr: unix.SYS_READ}); got != p.Foreign {
		t.Errorf("foreign architecture: %v, want %v", got, p.Foreign)
	}
}

// TestLongJumps compiles a policy whose lower half is longer than a
// conditional jump reaches, so the search must go through unconditional
// jumps, and checks every number still gets its rule.
func TestLongJumps(t *testing.T) {
	p := &Policy{Arch: 1, Default: Errno(syscall.ENOSYS), Foreign: Errno(syscall.EPERM), Rules: map[uint32]Rule{}}
	for nr := uint32(0); nr < 1200; nr += 2 {
		a := Allow
		if nr%6 == 0 {
			a = Errno(syscall.Errno(nr % 100))
		}
		p.Rules[nr] = Rule{Action: a}
	}
	prog, err := p.Compile()
	if err != nil {
		t.Fatal(err)
	}
	long := false
	for _, ins := range prog {
		if _, ok := ins.(bpf.Jump); ok {
			long = true
		}
	}
	if !long {
		t.Fatal("no unconditional jump: the test does not exercise long jumps")
	}
	for nr := uint32(0); nr < 1300; nr++ {
		want := p.Default
		if r, ok := p.Rules[nr]; ok {
			want = r.Action
		}
		if got := verdict(t, prog, call{arch: 1, nr: nr}); got != want {
			t.Fatalf("call %d: %v, want %v", nr, got, want)
		}
	}
}

// TestAuditFilterChangesNoVerdict: with the audit filter stacked on the
// default one, every call gets the default policy's verdict, and the
// audit filter decides (so the kernel logs) exactly the deliberate
// refusals: not an unknown call's ENOSYS, not sync's no-op, not an
// allowed call.
func TestAuditFilterChangesNoVerdict(t *testing.T) {
	p, prog := defaultProgram(t)
	ap, err := AuditPolicy()
	if err != nil {
		t.Fatal(err)
	}
	aprog, err := ap.Compile()
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("audit filter: %d rules, %d instructions", len(ap.Rules), len(aprog))
	// The kernel runs the newest filter first and keeps the first of the
	// most restrictive actions (compared as signed action values).
	stacked := func(c call) (Action, bool) {
		d, a := verdict(t, prog, c), verdict(t, aprog, c)
		if int32(d&0xffff0000) < int32(a&0xffff0000) {
			return d, false
		}
		return a, a != Allow
	}
	calls := []call{}
	for nr := uint32(0); nr < 1100; nr++ {
		calls = append(calls, call{nr: nr})
	}
	for _, cmd := range []uint64{0x40049409, 0xc0c0586d, 0x40086602, 0x5401, 0x80086601} {
		calls = append(calls, call{nr: unix.SYS_IOCTL, args: [6]uint64{3, cmd}})
	}
	for _, fl := range []uint64{cloneNewUser, 0x1200011, cloneNewTime, unix.CLONE_FILES} {
		calls = append(calls, call{nr: unix.SYS_CLONE, args: [6]uint64{fl}}, call{nr: unix.SYS_UNSHARE, args: [6]uint64{fl}})
	}
	calls = append(calls, call{nr: unix.SYS_SOCKET, args: [6]uint64{unix.AF_VSOCK}}, call{nr: unix.SYS_SOCKET, args: [6]uint64{unix.AF_INET}})
	logged := 0
	for _, c := range calls {
		c.arch = p.Arch
		want := verdict(t, prog, c)
		got, log := stacked(c)
		if got != want {
			t.Errorf("call %d %x: stacked verdict %v, default %v", c.nr, c.args[:2], got, want)
		}
		deliberate := want != Allow && want != Errno(unix.ENOSYS) && want != Errno(0)
		if log != deliberate {
			t.Errorf("call %d %x (%v): logged %v, want %v", c.nr, c.args[:2], want, log, deliberate)
		}
		if log {
			logged++
		}
	}
	if logged < 40 {
		t.Errorf("only %d refusals would be logged", logged)
	}
}
