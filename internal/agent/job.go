package agent

import (
	"context"
	"encoding/binary"
	"fmt"
	"syscall"
	"time"

	"github.com/warrenrl/warren/internal/backend"
	"github.com/warrenrl/warren/internal/errdefs"
)

const (
	frameJob       = 'J'
	frameJobStep   = 'k'
	frameJobResult = 'j'
)

// RunJob sends j in one JOB frame and reads a result frame per step as it
// ends and a last one after the reset: every step and the reset run in
// the agent without another round trip. An error after the job was sent
// comes with the steps that ended before it, and wraps backend.ErrJobCut.
func (c *Client) RunJob(ctx context.Context, j backend.Job) (backend.JobResult, error) {
	payload, err := EncodeJob(j)
	if err != nil {
		return backend.JobResult{}, err
	}
	conn, err := c.dial(ctx)
	if err != nil {
		return backend.JobResult{}, err
	}
	defer conn.Close()
	stop := interruptOn(ctx, conn)
	defer stop()
	if _, err := conn.Write(frame(frameJob, payload)); err != nil {
		return backend.JobResult{}, ioErr(ctx, err, "send job to sandbox agent")
	}
	var res backend.JobResult
	cut := func(err error) (backend.JobResult, error) {
		return res, fmt.Errorf("%w after %d of %d steps: %w", backend.ErrJobCut, len(res.Steps), len(j.Steps), err)
	}
	for {
		typ, body, err := readFrameMax(conn, maxPayload)
		if err != nil {
			return cut(ioErr(ctx, err, "read job result from sandbox agent"))
		}
		switch typ {
		case frameJobStep:
			if len(res.Steps) >= len(j.Steps) {
				return cut(errdefs.Internalf("sandbox agent: more step results than the job's %d steps", len(j.Steps)))
			}
			s, err := decodeStepResult(j.Steps[len(res.Steps)], body)
			if err != nil {
				return cut(err)
			}
			res.Steps = append(res.Steps, s)
			continue
		case frameJobResult:
			r := &reader{b: body}
			n, reset := r.u32(), syscall.Errno(r.u32())
			if r.bad || len(r.b) != 0 || n != uint32(len(res.Steps)) {
				return cut(errdefs.Internalf("sandbox agent: malformed job end (%d steps, %d received)", n, len(res.Steps)))
			}
			res.ResetErr = reset
			return res, nil
		case frameFailed:
			if len(body) >= 5 {
				errno := syscall.Errno(binary.LittleEndian.Uint32(body))
				return cut(errdefs.Internalf("sandbox agent refused the job (%s): %v", cstring(body[4:]), errno))
			}
		}
		return cut(errdefs.Internalf("sandbox agent: unexpected reply %q to a job", typ))
	}
}

func cstring(b []byte) string {
	for i, c := range b {
		if c == 0 {
			return string(b[:i])
		}
	}
	return string(b)
}

// EncodeJob is the payload of a JOB frame (doc.go, "Jobs").
func EncodeJob(j backend.Job) ([]byte, error) {
	if len(j.Steps) == 0 || len(j.Steps) > MaxJobSteps {
		return nil, errdefs.Invalidf("a job has 1 to %d steps", MaxJobSteps)
	}
	b := make([]byte, 0, 256)
	u32 := func(v uint32) { b = binary.LittleEndian.AppendUint32(b, v) }
	u64 := func(v uint64) { b = binary.LittleEndian.AppendUint64(b, v) }
	str := func(s string) { b = append(b, s...); b = append(b, 0) }
	u32(j.UID)
	u32(j.GID)
	u32(uint32(len(j.Steps)))
	u32(uint32(len(j.Wipe)))
	str(j.Workdir)
	for _, w := range j.Wipe {
		str(w)
	}
	for i, s := range j.Steps {
		if len(s.Argv) == 0 || s.Argv[0] == "" {
			return nil, errdefs.Invalidf("step %d: no command", i)
		}
		if len(s.Files) > MaxJobFiles || len(s.Outputs) > MaxJobFiles {
			return nil, errdefs.Invalidf("step %d: at most %d input and %d output files", i, MaxJobFiles, MaxJobFiles)
		}
		if s.Limits.Wall <= 0 {
			return nil, errdefs.Invalidf("step %d: no wall-time limit", i)
		}
		var flags uint32
		if s.Continue {
			flags |= 1
		}
		l := s.Limits
		u32(flags)
		u32(uint32(len(s.Argv)))
		u32(uint32(len(s.Env)))
		u32(uint32(len(s.Files)))
		u32(uint32(len(s.Outputs)))
		u64(uint64(l.CPU / time.Millisecond))
		u64(uint64((l.Wall + time.Millisecond - 1) / time.Millisecond))
		u64(uint64(l.MemoryBytes))
		u64(uint64(l.OutputBytes))
		u64(uint64(l.FileSizeBytes))
		u64(uint64(l.FileOutBytes))
		u32(l.Procs)
		u32(l.OpenFiles)
		u32(uint32(len(s.Stdin)))
		b = append(b, s.Stdin...)
		for _, a := range append(append([]string(nil), s.Argv...), s.Env...) {
			if containsNUL(a) {
				return nil, errdefs.Invalidf("step %d: argument or environment contains NUL", i)
			}
			str(a)
		}
		for _, f := range s.Files {
			if f.FromStep >= i {
				return nil, errdefs.Invalidf("step %d: file %q from step %d, which is not an earlier one", i, f.Name, f.FromStep)
			}
			u32(f.Mode & 0o7777)
			if f.FromStep >= 0 && f.From != "" {
				u32(uint32(f.FromStep))
				u32(0)
				str(f.Name)
				str(f.From)
			} else {
				u32(^uint32(0))
				u32(uint32(len(f.Data)))
				str(f.Name)
				b = append(b, f.Data...)
			}
		}
		for _, o := range s.Outputs {
			str(o)
		}
	}
	if len(b) > maxPayload {
		return nil, errdefs.Invalidf("job of %d bytes: at most %d", len(b), maxPayload)
	}
	return b, nil
}

func containsNUL(s string) bool {
	for i := 0; i < len(s); i++ {
		if s[i] == 0 {
			return true
		}
	}
	return false
}

// MaxJobSteps and MaxJobFiles are the agent's bounds on a job.
const (
	MaxJobSteps = 64
	MaxJobFiles = 64
)

type reader struct {
	b   []byte
	bad bool
}

func (r *reader) u32() uint32 {
	if len(r.b) < 4 {
		r.bad = true
		return 0
	}
	v := binary.LittleEndian.Uint32(r.b)
	r.b = r.b[4:]
	return v
}

func (r *reader) u64() uint64 {
	if len(r.b) < 8 {
		r.bad = true
		return 0
	}
	v := binary.LittleEndian.Uint64(r.b)
	r.b = r.b[8:]
	return v
}

func (r *reader) bytes(n uint32) []byte {
	if uint32(len(r.b)) < n {
		r.bad = true
		return nil
	}
	v := r.b[:n:n]
	r.b = r.b[n:]
	return v
}

func (r *reader) str() string {
	for i, c := range r.b {
		if c == 0 {
			s := string(r.b[:i])
			r.b = r.b[i+1:]
			return s
		}
	}
	r.bad = true
	return ""
}

// decodeStepResult decodes one step's 'k' frame (doc.go, "Jobs").
func decodeStepResult(st backend.Step, body []byte) (backend.StepResult, error) {
	r := &reader{b: body}
	var s backend.StepResult
	s.Status = backend.Status(r.u32())
	s.ExitCode = int(int32(r.u32()))
	s.Signal = syscall.Signal(r.u32())
	s.CPU = time.Duration(r.u64()) * time.Microsecond
	s.Wall = time.Duration(r.u64()) * time.Microsecond
	s.PeakMemoryBytes = r.u64()
	fl := r.u32()
	s.StdoutTruncated, s.StderrTruncated = fl&1 != 0, fl&2 != 0
	s.Errno = syscall.Errno(r.u32())
	s.What = r.str()
	s.Stdout = r.bytes(r.u32())
	s.Stderr = r.bytes(r.u32())
	nf := r.u32()
	if !r.bad && nf != uint32(len(st.Outputs)) {
		return s, errdefs.Internalf("sandbox agent: %d output files for a step that asked %d", nf, len(st.Outputs))
	}
	for k := uint32(0); k < nf && !r.bad; k++ {
		f := backend.FileOut{Name: st.Outputs[k], Err: syscall.Errno(r.u32())}
		f.Data = r.bytes(r.u32())
		s.Files = append(s.Files, f)
	}
	if r.bad || len(r.b) != 0 {
		return s, fmt.Errorf("sandbox agent: malformed step result: %w", errdefs.Internalf("%d bytes left", len(r.b)))
	}
	return s, nil
}
