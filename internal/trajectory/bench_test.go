package trajectory

import (
	"context"
	"path/filepath"
	"testing"

	warrenv1 "github.com/warrenrl/warren/gen/warren/v1"
)

// BenchmarkRecord is one live step: begin frame, end frame, fdatasync.
func BenchmarkRecord(b *testing.B) {
	l, err := Open(filepath.Join(b.TempDir(), "sb.log"), Options{})
	if err != nil {
		b.Fatal(err)
	}
	defer l.Close()
	req := &warrenv1.ExecRequest{SandboxId: "sb", Argv: []string{"true"}, IdempotencyKey: "0123456789abcdef0123456789abcdef"}
	res := &warrenv1.ExecResult{Pid: 42, DurationMs: 1}
	for b.Loop() {
		c := Call{Session: "", Hash: RequestHash(MethodExec, req), Entry: NewEntry(MethodExec, req)}
		o, err := l.Begin(context.Background(), c)
		if err != nil {
			b.Fatal(err)
		}
		if err := o.Live.Finish(res, nil, false, nil); err != nil {
			b.Fatal(err)
		}
	}
}

// BenchmarkReplay is one replayed step.
func BenchmarkReplay(b *testing.B) {
	l, err := Open(filepath.Join(b.TempDir(), "sb.log"), Options{})
	if err != nil {
		b.Fatal(err)
	}
	defer l.Close()
	req := &warrenv1.ExecRequest{SandboxId: "sb", Shell: "echo step >> /tmp/f", SessionId: "s", Seq: 1}
	c := Call{Session: "s", Seq: 1, Hash: RequestHash(MethodExec, req), Entry: NewEntry(MethodExec, req)}
	o, _ := l.Begin(context.Background(), c)
	o.Live.Finish(&warrenv1.ExecResult{Stdout: []byte("ok\n")}, nil, false, nil)
	for b.Loop() {
		c := Call{Session: "s", Seq: 1, Hash: RequestHash(MethodExec, req), Entry: NewEntry(MethodExec, req)}
		if o, err := l.Begin(context.Background(), c); err != nil || o.Replay == nil {
			b.Fatal(err)
		}
	}
}
