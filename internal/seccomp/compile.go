package seccomp

import (
	"encoding/binary"
	"encoding/hex"
	"fmt"
	"slices"
	"syscall"

	"golang.org/x/net/bpf"
)

// Action is a filter's verdict: SECCOMP_RET_* in the high 16 bits, its
// data (an errno) in the low 16.
type Action uint32

const (
	retErrno Action = 0x00050000
	retAllow Action = 0x7fff0000
)

// Allow lets the call through.
const Allow = retAllow

// Errno fails the call with e without running it; Errno(0) makes it
// return 0 without running it.
func Errno(e syscall.Errno) Action { return retErrno | Action(uint32(e)&0xffff) }

func (a Action) String() string {
	switch {
	case a == Allow:
		return "allow"
	case a&0xffff0000 == retErrno:
		if a&0xffff == 0 {
			return "skip"
		}
		return "errno " + syscall.Errno(a&0xffff).Error()
	}
	return fmt.Sprintf("action %#x", uint32(a))
}

// Op is how an ArgCheck compares an argument's low 32 bits.
type Op uint8

const (
	// MaskedEqual matches when arg & Mask == Value.
	MaskedEqual Op = iota
	// AnyBits matches when arg & Mask != 0.
	AnyBits
)

// ArgCheck matches one argument of a call, on its low 32 bits.
type ArgCheck struct {
	Arg    int // 0 to 5
	Op     Op
	Mask   uint32
	Value  uint32 // MaskedEqual only
	Action Action
}

// Rule is what happens to one system call: the first ArgCheck that
// matches decides, else Action.
type Rule struct {
	Action Action
	Checks []ArgCheck
}

// Policy is a whole filter for one architecture.
type Policy struct {
	Arch    uint32          // AUDIT_ARCH_* of the calls it judges
	Default Action          // for numbers Rules does not name
	Foreign Action          // for calls of any other architecture (i386 on amd64, arm32 on arm64)
	Rules   map[uint32]Rule // by system call number
}

// seccomp_data: nr at 0, arch at 4, instruction pointer at 8, the six
// arguments from 16 on, 8 bytes each. The low word of an argument comes
// first on the little-endian architectures this package has policies for.
const (
	offNr   = 0
	offArch = 4
	offArgs = 16
)

// maxSkip is the longest forward jump a conditional instruction encodes.
const maxSkip = 255

// Compile turns the policy into a program: check the architecture, load
// the call number, then a binary search over ranges of numbers that share
// a verdict.
func (p *Policy) Compile() ([]bpf.Instruction, error) {
	for nr, r := range p.Rules {
		for _, c := range r.Checks {
			if c.Arg < 0 || c.Arg > 5 {
				return nil, fmt.Errorf("seccomp: rule for call %d checks argument %d", nr, c.Arg)
			}
		}
	}
	prog := []bpf.Instruction{
		bpf.LoadAbsolute{Off: offArch, Size: 4},
		bpf.JumpIf{Cond: bpf.JumpEqual, Val: p.Arch, SkipTrue: 1},
		bpf.RetConstant{Val: uint32(p.Foreign)},
		bpf.LoadAbsolute{Off: offNr, Size: 4},
	}
	// The last range runs from above the highest rule to 2^32-1, so the
	// x32 numbers on amd64 (bit 30 set) take the default too.
	return append(prog, search(p.ranges())...), nil
}

// span is a range of call numbers [lo, next span's lo) with one rule.
type span struct {
	lo   uint32
	rule Rule
}

func (p *Policy) ranges() []span {
	nrs := make([]uint32, 0, len(p.Rules))
	for nr := range p.Rules {
		nrs = append(nrs, nr)
	}
	slices.Sort(nrs)
	def := Rule{Action: p.Default}
	spans := []span{{0, def}}
	add := func(lo uint32, r Rule) {
		last := &spans[len(spans)-1]
		if len(r.Checks) == 0 && len(last.rule.Checks) == 0 && last.rule.Action == r.Action {
			return // same verdict as the span it extends
		}
		if last.lo == lo {
			last.rule = r
			return
		}
		spans = append(spans, span{lo, r})
	}
	for _, nr := range nrs {
		add(nr, p.Rules[nr])
		if _, ok := p.Rules[nr+1]; !ok {
			add(nr+1, def)
		}
	}
	return spans
}

// search emits a binary search over spans, the call number in A: "nr >=
// mid.lo" jumps over the lower half. A jump longer than a conditional
// instruction can encode goes through an unconditional one.
func search(spans []span) []bpf.Instruction {
	if len(spans) == 1 {
		return leaf(spans[0].rule)
	}
	mid := len(spans) / 2
	low, high := search(spans[:mid]), search(spans[mid:])
	var out []bpf.Instruction
	if len(low) <= maxSkip {
		out = append(out, bpf.JumpIf{Cond: bpf.JumpGreaterOrEqual, Val: spans[mid].lo, SkipTrue: uint8(len(low))})
	} else {
		out = append(out,
			bpf.JumpIf{Cond: bpf.JumpGreaterOrEqual, Val: spans[mid].lo, SkipFalse: 1},
			bpf.Jump{Skip: uint32(len(low))})
	}
	out = append(out, low...)
	return append(out, high...)
}

func leaf(r Rule) []bpf.Instruction {
	var out []bpf.Instruction
	for _, c := range r.Checks {
		out = append(out, bpf.LoadAbsolute{Off: offArgs + 8*uint32(c.Arg), Size: 4})
		switch c.Op {
		case MaskedEqual:
			out = append(out,
				bpf.ALUOpConstant{Op: bpf.ALUOpAnd, Val: c.Mask},
				bpf.JumpIf{Cond: bpf.JumpEqual, Val: c.Value, SkipFalse: 1})
		case AnyBits:
			out = append(out, bpf.JumpIf{Cond: bpf.JumpBitsSet, Val: c.Mask, SkipFalse: 1})
		}
		out = append(out, bpf.RetConstant{Val: uint32(c.Action)})
	}
	return append(out, bpf.RetConstant{Val: uint32(r.Action)})
}

// maxInsns is the kernel's limit on a filter's length (BPF_MAXINSNS).
const maxInsns = 4096

// Encode assembles the program into struct sock_filter entries, in the
// machine's byte order: what seccomp(2) takes.
func Encode(prog []bpf.Instruction) ([]byte, error) {
	if len(prog) > maxInsns {
		return nil, fmt.Errorf("seccomp: %d instructions, the kernel takes at most %d", len(prog), maxInsns)
	}
	raw, err := bpf.Assemble(prog)
	if err != nil {
		return nil, fmt.Errorf("seccomp: %w", err)
	}
	out := make([]byte, 0, 8*len(raw))
	for _, r := range raw {
		out = binary.NativeEndian.AppendUint16(out, r.Op)
		out = append(out, r.Jt, r.Jf)
		out = binary.NativeEndian.AppendUint32(out, r.K)
	}
	return out, nil
}

// Default compiles the default policy of this architecture, as the init
// stage's config carries it: hex of the sock_filter entries.
func Default() (string, error) { return compileHex(DefaultPolicy) }

// Audit compiles the audit policy of this architecture (AuditPolicy), in
// hex as Default.
func Audit() (string, error) { return compileHex(AuditPolicy) }

func compileHex(policy func() (*Policy, error)) (string, error) {
	p, err := policy()
	if err != nil {
		return "", err
	}
	prog, err := p.Compile()
	if err != nil {
		return "", err
	}
	b, err := Encode(prog)
	if err != nil {
		return "", err
	}
	return hex.EncodeToString(b), nil
}
