package e2b

import (
	"context"
	"encoding/base64"
	"errors"
	"fmt"
	"net/http"
	"strconv"
	"strings"
	"sync"
	"time"

	"connectrpc.com/connect"
	"golang.org/x/sys/unix"

	processpb "github.com/warrenrl/warren/gen/e2b/process"
	warrenv1 "github.com/warrenrl/warren/gen/warren/v1"
	"github.com/warrenrl/warren/internal/errdefs"
	"github.com/warrenrl/warren/internal/server"
)

// processService serves envd's process.Process over Warren's background
// processes: Start is StartProcess then AttachProcess, a pid selector is
// the Warren process whose in-sandbox pid it is.
type processService struct{ s *Server }

// rpcErr gives a Manager error its Connect code (the same mapping as
// Warren's own API).
func rpcErr(err error) error {
	if err == nil {
		return nil
	}
	return server.ToConnectError(err)
}

// execUser is the Warren user of a call: the SDKs name one in
// "Authorization: Basic base64(user:)". E2B templates' default account is
// "user"; Warren's images have their own default, which that name maps to.
func execUser(h http.Header) string {
	v, ok := strings.CutPrefix(h.Get("Authorization"), "Basic ")
	if !ok {
		return ""
	}
	b, err := base64.StdEncoding.DecodeString(v)
	if err != nil {
		return ""
	}
	user, _, _ := strings.Cut(string(b), ":")
	if user == "user" {
		return ""
	}
	return user
}

// keepaliveEvery is how often a stream without output sends a keepalive:
// the interval the SDK asks for (Keepalive-Ping-Interval, seconds), else
// E2B's 50 s, so that proxies between do not cut an idle stream.
func keepaliveEvery(h http.Header) time.Duration {
	if n, err := strconv.Atoi(h.Get("Keepalive-Ping-Interval")); err == nil && n > 0 {
		return time.Duration(n) * time.Second
	}
	return 50 * time.Second
}

// maxCommandTimeout caps a command's timeout at the daemon's default
// cap of lifetimes (daemon.MaxTimeout): a longer one would be refused.
const maxCommandTimeout = 24 * time.Hour

func (p processService) Start(ctx context.Context, req *connect.Request[processpb.StartRequest], st *connect.ServerStream[processpb.StartResponse]) error {
	id := sandboxOf(ctx)
	cfg := req.Msg.GetProcess()
	if cfg.GetCmd() == "" {
		return rpcErr(errdefs.Invalidf("process.cmd is empty"))
	}
	cmd := cfg.GetCmd()
	// The SDKs run every command as /bin/bash -l -c CMD; an image without
	// bash (busybox, alpine) runs it with its /bin/sh, which takes the same
	// flags.
	if cmd == "/bin/bash" {
		if _, err := p.s.m.StatFile(ctx, &warrenv1.StatFileRequest{SandboxId: id, Path: "/bin/bash"}); server.CategoryOf(err) == errdefs.NotFound {
			cmd = "/bin/sh"
		}
	}
	er := &warrenv1.ExecRequest{
		SandboxId: id,
		Argv:      append([]string{cmd}, cfg.GetArgs()...),
		Env:       cfg.GetEnvs(),
		Cwd:       cfg.GetCwd(),
		User:      execUser(req.Header()),
	}
	// As envd does, the call's deadline (the SDK's command timeout) is the
	// command's: Warren kills its process group when it passes. A client
	// that goes away earlier leaves it running.
	if ms, err := strconv.ParseInt(req.Header().Get("Connect-Timeout-Ms"), 10, 64); err == nil && ms > 0 {
		er.TimeoutMs = min(ms, maxCommandTimeout.Milliseconds())
	}
	if pty := req.Msg.GetPty(); pty != nil {
		er.Pty, er.Rows, er.Cols = true, pty.GetSize().GetRows(), pty.GetSize().GetCols()
	}
	info, err := p.s.m.StartProcess(ctx, er)
	if err != nil {
		return rpcErr(err)
	}
	// Without stdin (the SDKs' default) the process reads EOF, as under
	// envd; absent means kept open (older SDKs).
	if req.Msg.Stdin != nil && !req.Msg.GetStdin() && !er.Pty {
		if _, err := p.s.m.WriteStdin(ctx, &warrenv1.WriteStdinRequest{SandboxId: id, ProcessId: info.GetProcessId(), Close: true}); err != nil && server.CategoryOf(err) != errdefs.Conflict {
			return rpcErr(err)
		}
	}
	send := func(ev *processpb.ProcessEvent) error { return st.Send(&processpb.StartResponse{Event: ev}) }
	return p.stream(ctx, req.Header(), info, 0, 0, send)
}

func (p processService) Connect(ctx context.Context, req *connect.Request[processpb.ConnectRequest], st *connect.ServerStream[processpb.ConnectResponse]) error {
	info, err := p.find(ctx, req.Msg.GetProcess())
	if err != nil {
		return rpcErr(err)
	}
	// From the output produced so far: a reconnecting handle sees what
	// comes next, as with envd.
	send := func(ev *processpb.ProcessEvent) error { return st.Send(&processpb.ConnectResponse{Event: ev}) }
	return p.stream(ctx, req.Header(), info, info.GetStdoutBytes(), info.GetStderrBytes(), send)
}

// stream sends the start event, the process's output from the given
// offsets, keepalives while it is quiet, and its end. The process runs on
// when the client goes: it is reached again by Connect, or ends with its
// sandbox.
func (p processService) stream(ctx context.Context, h http.Header, info *warrenv1.ProcessInfo, outOff, errOff int64, send func(*processpb.ProcessEvent) error) error {
	var mu sync.Mutex // connect's ServerStream is not safe for concurrent sends
	locked := func(ev *processpb.ProcessEvent) error {
		mu.Lock()
		defer mu.Unlock()
		return send(ev)
	}
	if err := locked(&processpb.ProcessEvent{Event: &processpb.ProcessEvent_Start{Start: &processpb.ProcessEvent_StartEvent{Pid: uint32(info.GetPid())}}}); err != nil {
		return err
	}
	ctx, closeStream := p.s.open.open(ctx, info.GetSandboxId())
	defer closeStream()
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	go func() {
		t := time.NewTicker(keepaliveEvery(h))
		defer t.Stop()
		for {
			select {
			case <-ctx.Done():
				return
			case <-t.C:
				if locked(&processpb.ProcessEvent{Event: &processpb.ProcessEvent_Keepalive{Keepalive: &processpb.ProcessEvent_KeepAlive{}}}) != nil {
					cancel()
					return
				}
			}
		}
	}()
	pty := info.GetPty()
	data := func(d *processpb.ProcessEvent_DataEvent) *processpb.ProcessEvent {
		return &processpb.ProcessEvent{Event: &processpb.ProcessEvent_Data{Data: d}}
	}
	ended := false
	err := p.s.m.AttachProcess(ctx, &warrenv1.AttachProcessRequest{
		SandboxId: info.GetSandboxId(), ProcessId: info.GetProcessId(), StdoutOffset: outOff, StderrOffset: errOff,
	}, func(ev *warrenv1.ProcessEvent) error {
		switch e := ev.GetEvent().(type) {
		case *warrenv1.ProcessEvent_Stdout:
			if pty {
				return locked(data(&processpb.ProcessEvent_DataEvent{Output: &processpb.ProcessEvent_DataEvent_Pty{Pty: e.Stdout.GetData()}}))
			}
			return locked(data(&processpb.ProcessEvent_DataEvent{Output: &processpb.ProcessEvent_DataEvent_Stdout{Stdout: e.Stdout.GetData()}}))
		case *warrenv1.ProcessEvent_Stderr:
			return locked(data(&processpb.ProcessEvent_DataEvent{Output: &processpb.ProcessEvent_DataEvent_Stderr{Stderr: e.Stderr.GetData()}}))
		case *warrenv1.ProcessEvent_Exit:
			ended = true
			return locked(&processpb.ProcessEvent{Event: &processpb.ProcessEvent_End{End: endEvent(e.Exit)}})
		}
		return nil
	})
	if err != nil {
		if errors.Is(context.Cause(ctx), errPaused) {
			return connect.NewError(connect.CodeUnavailable, errPaused)
		}
		return rpcErr(err)
	}
	if !ended {
		return connect.NewError(connect.CodeUnavailable, fmt.Errorf("process %d: output stream ended without an exit", info.GetPid()))
	}
	return nil
}

// endEvent is envd's end of a process: its exit code, or -1 and the
// signal's name as Go's os.ProcessState prints it (which is what envd
// reports, and the SDKs show).
func endEvent(r *warrenv1.ExecResult) *processpb.ProcessEvent_EndEvent {
	end := &processpb.ProcessEvent_EndEvent{ExitCode: r.GetExitCode(), Exited: r.GetSignal() == 0}
	switch {
	case r.GetSignal() != 0:
		end.ExitCode = -1
		end.Status = "signal: " + unix.SignalName(unix.Signal(r.GetSignal()))
		if r.GetTimedOut() {
			msg := "timed out"
			end.Error = &msg
		}
	default:
		end.Status = fmt.Sprintf("exit status %d", r.GetExitCode())
	}
	return end
}

// find is the Warren process a selector names: the running one with that
// in-sandbox pid, else the latest that had it.
func (p processService) find(ctx context.Context, sel *processpb.ProcessSelector) (*warrenv1.ProcessInfo, error) {
	id := sandboxOf(ctx)
	if sel == nil {
		return nil, errdefs.Invalidf("no process selector")
	}
	if _, ok := sel.GetSelector().(*processpb.ProcessSelector_Tag); ok {
		return nil, errdefs.Unsupportedf("process tags are not supported; select by pid")
	}
	pid := int32(sel.GetPid())
	res, err := p.s.m.ListProcesses(ctx, &warrenv1.ListProcessesRequest{SandboxId: id})
	if err != nil {
		return nil, err
	}
	var found *warrenv1.ProcessInfo
	for _, pi := range res.GetProcesses() {
		if pi.GetPid() != pid {
			continue
		}
		if pi.GetRunning() {
			return pi, nil
		}
		if found == nil || pi.GetStartedAtUnixMs() >= found.GetStartedAtUnixMs() {
			found = pi
		}
	}
	if found == nil {
		return nil, errdefs.NotFoundf("process with pid %d not found in sandbox %s", pid, id)
	}
	return found, nil
}

func (p processService) List(ctx context.Context, _ *connect.Request[processpb.ListRequest]) (*connect.Response[processpb.ListResponse], error) {
	res, err := p.s.m.ListProcesses(ctx, &warrenv1.ListProcessesRequest{SandboxId: sandboxOf(ctx)})
	if err != nil {
		return nil, rpcErr(err)
	}
	out := &processpb.ListResponse{}
	for _, pi := range res.GetProcesses() {
		if !pi.GetRunning() || len(pi.GetArgv()) == 0 {
			continue
		}
		out.Processes = append(out.Processes, &processpb.ProcessInfo{
			Pid:    uint32(pi.GetPid()),
			Config: &processpb.ProcessConfig{Cmd: pi.GetArgv()[0], Args: pi.GetArgv()[1:]},
		})
	}
	return connect.NewResponse(out), nil
}

func (p processService) SendSignal(ctx context.Context, req *connect.Request[processpb.SendSignalRequest]) (*connect.Response[processpb.SendSignalResponse], error) {
	info, err := p.find(ctx, req.Msg.GetProcess())
	if err != nil {
		return nil, rpcErr(err)
	}
	sig := int32(unix.SIGTERM)
	switch req.Msg.GetSignal() {
	case processpb.Signal_SIGNAL_SIGKILL:
		sig = int32(unix.SIGKILL)
	case processpb.Signal_SIGNAL_SIGTERM:
	default:
		return nil, rpcErr(errdefs.Invalidf("signal %v: want SIGTERM or SIGKILL", req.Msg.GetSignal()))
	}
	// The whole group, as envd kills a command and its children.
	if _, err := p.s.m.SignalProcess(ctx, &warrenv1.SignalProcessRequest{SandboxId: info.GetSandboxId(), ProcessId: info.GetProcessId(), Signal: sig, Group: true}); err != nil {
		return nil, rpcErr(err)
	}
	return connect.NewResponse(&processpb.SendSignalResponse{}), nil
}

// input writes one input message to the process's stdin (or terminal).
func (p processService) input(ctx context.Context, info *warrenv1.ProcessInfo, in *processpb.ProcessInput) error {
	var b []byte
	switch x := in.GetInput().(type) {
	case *processpb.ProcessInput_Stdin:
		b = x.Stdin
	case *processpb.ProcessInput_Pty:
		b = x.Pty
	}
	_, err := p.s.m.WriteStdin(ctx, &warrenv1.WriteStdinRequest{SandboxId: info.GetSandboxId(), ProcessId: info.GetProcessId(), Data: b})
	return err
}

func (p processService) SendInput(ctx context.Context, req *connect.Request[processpb.SendInputRequest]) (*connect.Response[processpb.SendInputResponse], error) {
	info, err := p.find(ctx, req.Msg.GetProcess())
	if err != nil {
		return nil, rpcErr(err)
	}
	if err := p.input(ctx, info, req.Msg.GetInput()); err != nil {
		return nil, rpcErr(err)
	}
	return connect.NewResponse(&processpb.SendInputResponse{}), nil
}

func (p processService) StreamInput(ctx context.Context, st *connect.ClientStream[processpb.StreamInputRequest]) (*connect.Response[processpb.StreamInputResponse], error) {
	var info *warrenv1.ProcessInfo
	for st.Receive() {
		switch ev := st.Msg().GetEvent().(type) {
		case *processpb.StreamInputRequest_Start:
			var err error
			if info, err = p.find(ctx, ev.Start.GetProcess()); err != nil {
				return nil, rpcErr(err)
			}
		case *processpb.StreamInputRequest_Data:
			if info == nil {
				return nil, rpcErr(errdefs.Invalidf("input before the start event naming the process"))
			}
			if err := p.input(ctx, info, ev.Data.GetInput()); err != nil {
				return nil, rpcErr(err)
			}
		}
	}
	if err := st.Err(); err != nil {
		return nil, err
	}
	return connect.NewResponse(&processpb.StreamInputResponse{}), nil
}

func (p processService) CloseStdin(ctx context.Context, req *connect.Request[processpb.CloseStdinRequest]) (*connect.Response[processpb.CloseStdinResponse], error) {
	info, err := p.find(ctx, req.Msg.GetProcess())
	if err != nil {
		return nil, rpcErr(err)
	}
	if _, err := p.s.m.WriteStdin(ctx, &warrenv1.WriteStdinRequest{SandboxId: info.GetSandboxId(), ProcessId: info.GetProcessId(), Close: true}); err != nil {
		return nil, rpcErr(err)
	}
	return connect.NewResponse(&processpb.CloseStdinResponse{}), nil
}

func (p processService) Update(ctx context.Context, req *connect.Request[processpb.UpdateRequest]) (*connect.Response[processpb.UpdateResponse], error) {
	info, err := p.find(ctx, req.Msg.GetProcess())
	if err != nil {
		return nil, rpcErr(err)
	}
	if sz := req.Msg.GetPty().GetSize(); sz != nil {
		if _, err := p.s.m.ResizeProcess(ctx, &warrenv1.ResizeProcessRequest{SandboxId: info.GetSandboxId(), ProcessId: info.GetProcessId(), Rows: sz.GetRows(), Cols: sz.GetCols()}); err != nil {
			return nil, rpcErr(err)
		}
	}
	return connect.NewResponse(&processpb.UpdateResponse{}), nil
}
