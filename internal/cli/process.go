package cli

import (
	"context"
	"fmt"
	"io"
	"os"
	"os/signal"
	"strconv"
	"strings"
	"syscall"
	"text/tabwriter"
	"time"

	"github.com/spf13/cobra"
	"golang.org/x/sys/unix"

	"github.com/warrenrl/warren/client"
	warrenv1 "github.com/warrenrl/warren/gen/warren/v1"
)

// startBackground is `exec --background`: it prints the process id (or
// the ProcessInfo with --json) and returns.
func startBackground(cmd *cobra.Command, cl *client.Client, req *warrenv1.ExecRequest) error {
	info, err := cl.StartProcess(cmd.Context(), req)
	if err != nil {
		return err
	}
	if JSONOutput(cmd) {
		return printJSON(cmd.OutOrStdout(), info)
	}
	fmt.Fprintln(cmd.OutOrStdout(), info.GetProcessId())
	return nil
}

func newPsCommand() *cobra.Command {
	return &cobra.Command{
		Use:   "ps ID",
		Short: "List a sandbox's background processes",
		Args:  exactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			cl, err := NewClient(cmd)
			if err != nil {
				return err
			}
			defer cl.Close()
			ps, err := cl.ListProcesses(cmd.Context(), args[0])
			if err != nil {
				return err
			}
			if JSONOutput(cmd) {
				return printJSON(cmd.OutOrStdout(), &warrenv1.ListProcessesResponse{Processes: ps})
			}
			printProcessTable(cmd.OutOrStdout(), ps, time.Now())
			return nil
		},
	}
}

func printProcessTable(w io.Writer, ps []*warrenv1.ProcessInfo, now time.Time) {
	tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "PROCESS\tPID\tSTATUS\tAGE\tOUTPUT\tCOMMAND")
	for _, p := range ps {
		status := "running"
		if r := p.GetResult(); r != nil {
			switch {
			case r.GetTimedOut():
				status = "timed out"
			case r.GetSignal() != 0:
				status = fmt.Sprintf("killed (%v)", syscall.Signal(r.GetSignal()))
			default:
				status = fmt.Sprintf("exited %d", r.GetExitCode())
			}
		}
		if p.GetPty() {
			status += ", pty"
		}
		out := "-"
		if p.GetStdoutBytes()+p.GetStderrBytes() > 0 {
			out = formatBytes(p.GetStdoutBytes()) + "/" + formatBytes(p.GetStderrBytes())
		}
		fmt.Fprintf(tw, "%s\t%d\t%s\t%s\t%s\t%s\n", p.GetProcessId(), p.GetPid(), status,
			formatAge(p.GetStartedAtUnixMs(), now), out, strings.Join(p.GetArgv(), " "))
	}
	tw.Flush()
}

func newKillCommand() *cobra.Command {
	var (
		sig   string
		group bool
	)
	c := &cobra.Command{
		Use:   "kill [-s SIGNAL] [--group] ID PROCESS",
		Short: "Signal a background process (default SIGTERM)",
		Args:  exactArgs(2),
		RunE: func(cmd *cobra.Command, args []string) error {
			n, err := parseSignal(sig)
			if err != nil {
				return usageError{err}
			}
			cl, err := NewClient(cmd)
			if err != nil {
				return err
			}
			defer cl.Close()
			return cl.SignalProcess(cmd.Context(), &warrenv1.SignalProcessRequest{SandboxId: args[0], ProcessId: args[1], Signal: int32(n), Group: group})
		},
	}
	c.Flags().StringVarP(&sig, "signal", "s", "TERM", "signal name or number (TERM, KILL, INT, HUP, 9, ...)")
	c.Flags().BoolVar(&group, "group", false, "signal the whole process group")
	return c
}

// parseSignal takes a number or a name with or without SIG.
func parseSignal(s string) (syscall.Signal, error) {
	if n, err := strconv.Atoi(s); err == nil {
		if n < 1 || n > 64 {
			return 0, fmt.Errorf("signal %d out of range 1..64", n)
		}
		return syscall.Signal(n), nil
	}
	if n := unix.SignalNum("SIG" + strings.TrimPrefix(strings.ToUpper(s), "SIG")); n != 0 {
		return n, nil
	}
	return 0, fmt.Errorf("unknown signal %q", s)
}

func newAttachCommand() *cobra.Command {
	var (
		stdin, tty bool
		offset     int64
		tail       bool
	)
	c := &cobra.Command{
		Use:   "attach [-i] [-t] [--offset N | --tail] ID PROCESS",
		Short: "Follow a background process's output, and type into it",
		Long: `Follow a background process's output until it exits, and exit with its
exit status. By default the output starts from what is still kept of
it (--offset picks a byte offset, --tail only new output). -i sends this
terminal's input to the process's stdin; -t also puts this terminal in
raw mode and passes its size along (for a process started with
exec --background --pty, such as an interactive shell). Detach with
Ctrl-] (-t) or by closing stdin; the process keeps running.`,
		Args: exactArgs(2),
		RunE: func(cmd *cobra.Command, args []string) error {
			cl, err := NewClient(cmd)
			if err != nil {
				return err
			}
			defer cl.Close()
			return attach(cmd, cl, args[0], args[1], stdin || tty, tty, offset, tail)
		},
	}
	f := c.Flags()
	f.BoolVarP(&stdin, "stdin", "i", false, "send this process's stdin to the process")
	f.BoolVarP(&tty, "tty", "t", false, "raw terminal mode and window size (implies -i)")
	f.Int64Var(&offset, "offset", 0, "start at this byte offset of the output")
	f.BoolVar(&tail, "tail", false, "only output produced from now on")
	return c
}

func attach(cmd *cobra.Command, cl *client.Client, id, proc string, in, tty bool, offset int64, tail bool) error {
	ctx, cancel := context.WithCancel(cmd.Context())
	defer cancel()
	req := &warrenv1.AttachProcessRequest{SandboxId: id, ProcessId: proc, StdoutOffset: offset, StderrOffset: offset}
	if tail {
		ps, err := cl.ListProcesses(ctx, id)
		if err != nil {
			return err
		}
		for _, p := range ps {
			if p.GetProcessId() == proc {
				req.StdoutOffset, req.StderrOffset = p.GetStdoutBytes(), p.GetStderrBytes()
			}
		}
	}
	out, errOut := cmd.OutOrStdout(), cmd.ErrOrStderr()
	if tty {
		restore, err := rawTerminal(cmd.InOrStdin())
		if err != nil {
			return err
		}
		defer restore()
		stopResize := forwardResize(ctx, cl, id, proc, cmd.InOrStdin())
		defer stopResize()
	}
	if in {
		go forwardStdin(ctx, cancel, cl, id, proc, cmd.InOrStdin(), tty)
	}
	res, err := cl.AttachProcess(ctx, req, func(ev *warrenv1.ProcessEvent) error {
		if c := ev.GetStdout(); c != nil {
			_, err := out.Write(c.GetData())
			return err
		}
		if c := ev.GetStderr(); c != nil {
			_, err := errOut.Write(c.GetData())
			return err
		}
		return nil
	})
	if err != nil {
		if ctx.Err() != nil && cmd.Context().Err() == nil {
			return nil // detached
		}
		return err
	}
	if code := exitStatus(res); code != 0 {
		return exitError{code}
	}
	return nil
}

// detachKey (Ctrl-]) ends an attach in raw mode, where Ctrl-C goes to
// the process.
const detachKey = 0x1d

// forwardStdin copies in to the process's stdin; EOF closes the
// process's stdin (for a pipe) and, in raw mode, detach ends the attach.
func forwardStdin(ctx context.Context, cancel context.CancelFunc, cl *client.Client, id, proc string, in io.Reader, tty bool) {
	buf := make([]byte, 32<<10)
	for {
		n, err := in.Read(buf)
		if n > 0 {
			data := buf[:n]
			if tty {
				if i := strings.IndexByte(string(data), detachKey); i >= 0 {
					data = data[:i]
					if len(data) > 0 {
						_ = cl.WriteStdin(ctx, &warrenv1.WriteStdinRequest{SandboxId: id, ProcessId: proc, Data: append([]byte(nil), data...)})
					}
					cancel()
					return
				}
			}
			if werr := cl.WriteStdin(ctx, &warrenv1.WriteStdinRequest{SandboxId: id, ProcessId: proc, Data: append([]byte(nil), data...)}); werr != nil {
				return
			}
		}
		if err != nil {
			if !tty {
				_ = cl.WriteStdin(ctx, &warrenv1.WriteStdinRequest{SandboxId: id, ProcessId: proc, Close: true})
			}
			return
		}
	}
}

// rawTerminal puts the terminal on in into raw mode, when it is one.
func rawTerminal(in io.Reader) (restore func(), err error) {
	f, ok := in.(*os.File)
	if !ok {
		return func() {}, nil
	}
	fd := int(f.Fd())
	old, err := unix.IoctlGetTermios(fd, unix.TCGETS)
	if err != nil {
		return func() {}, nil // not a terminal: pass bytes as they are
	}
	raw := *old
	raw.Iflag &^= unix.IGNBRK | unix.BRKINT | unix.PARMRK | unix.ISTRIP | unix.INLCR | unix.IGNCR | unix.ICRNL | unix.IXON
	raw.Oflag &^= unix.OPOST
	raw.Lflag &^= unix.ECHO | unix.ECHONL | unix.ICANON | unix.ISIG | unix.IEXTEN
	raw.Cflag &^= unix.CSIZE | unix.PARENB
	raw.Cflag |= unix.CS8
	raw.Cc[unix.VMIN], raw.Cc[unix.VTIME] = 1, 0
	if err := unix.IoctlSetTermios(fd, unix.TCSETS, &raw); err != nil {
		return nil, fmt.Errorf("raw terminal mode: %w", err)
	}
	return func() { _ = unix.IoctlSetTermios(fd, unix.TCSETS, old) }, nil
}

// forwardResize sends this terminal's size now and on every SIGWINCH.
func forwardResize(ctx context.Context, cl *client.Client, id, proc string, in io.Reader) (stop func()) {
	f, ok := in.(*os.File)
	if !ok {
		return func() {}
	}
	send := func() {
		ws, err := unix.IoctlGetWinsize(int(f.Fd()), unix.TIOCGWINSZ)
		if err == nil && ws.Row > 0 && ws.Col > 0 {
			_ = cl.ResizeProcess(ctx, &warrenv1.ResizeProcessRequest{SandboxId: id, ProcessId: proc, Rows: uint32(ws.Row), Cols: uint32(ws.Col)})
		}
	}
	send()
	ch := make(chan os.Signal, 1)
	signal.Notify(ch, syscall.SIGWINCH)
	done := make(chan struct{})
	go func() {
		for {
			select {
			case <-ch:
				send()
			case <-done:
				return
			}
		}
	}()
	return func() {
		signal.Stop(ch)
		close(done)
	}
}
