package cli

import (
	"fmt"
	"io"
	"syscall"
	"time"

	"github.com/spf13/cobra"

	warrenv1 "github.com/warrenrl/warren/gen/warren/v1"
)

const maxStdin = 64 << 20

func newExecCommand() *cobra.Command {
	var (
		user, cwd, shell, outputLimit, idemKey string
		env                                    []string
		timeout                                time.Duration
		stream, stdin, background, pty         bool
		rows, cols                             uint32
	)
	c := &cobra.Command{
		Use:   "exec [flags] ID [--] ARGV... | exec [flags] --shell 'CMD' ID",
		Short: "Run a command in a sandbox",
		Long: `Run a command in a sandbox and exit with its exit status.

Flags go before the sandbox id; everything after it is the command. The
command's stdout and stderr go to the matching streams of this process.
A command killed by a signal exits with 128+signal, one that timed out
with 124.

--background starts the command as a background process and prints its
process id: it keeps running (across daemon restarts too) until it exits
or the sandbox goes; see sandbox ps, attach and kill. --pty runs the
command on a terminal (its output, raw, on stdout); with --stream and
no --rows/--cols its size follows this terminal's (stdin), resizes too.
For an interactive program start it with --background --pty, then
attach -t ID p-1.`,
		Args: minArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			argv := args[1:]
			if len(argv) > 0 && argv[0] == "--" {
				argv = argv[1:]
			}
			if (shell == "") == (len(argv) == 0) {
				return usagef("give a command after the sandbox id, or --shell, not both")
			}
			req := &warrenv1.ExecRequest{SandboxId: args[0], Argv: argv, Shell: shell, User: user, Cwd: cwd, IdempotencyKey: idemKey}
			var err error
			if req.Env, err = parseKVs("env", env); err != nil {
				return err
			}
			if timeout < 0 {
				return usagef("--timeout must not be negative")
			}
			req.TimeoutMs = timeout.Milliseconds()
			req.Pty, req.Rows, req.Cols = pty, rows, cols
			if background && (stream || idemKey != "") {
				return usagef("--background does not go with --stream or --idempotency-key")
			}
			if outputLimit != "" {
				if req.OutputLimitBytes, err = parseBytes(outputLimit); err != nil {
					return usageError{err}
				}
			}
			if stdin {
				b, err := io.ReadAll(io.LimitReader(cmd.InOrStdin(), maxStdin+1))
				if err != nil {
					return fmt.Errorf("read stdin: %w", err)
				}
				if len(b) > maxStdin {
					return fmt.Errorf("stdin is larger than %d bytes; copy it in with `warren sandbox cp` instead", maxStdin)
				}
				req.Stdin = b
			}
			cl, err := NewClient(cmd)
			if err != nil {
				return err
			}
			defer cl.Close()
			if background {
				return startBackground(cmd, cl, req)
			}
			out, errOut := cmd.OutOrStdout(), cmd.ErrOrStderr()
			jsonOut := JSONOutput(cmd)

			var res *warrenv1.ExecResult
			if stream {
				stopResize := func() {}
				res, err = cl.ExecStream(cmd.Context(), req, func(ev *warrenv1.ExecEvent) error {
					// Without --rows/--cols the pty follows this terminal's
					// size (now and on SIGWINCH) while the command runs.
					if s := ev.GetStarted(); s != nil && rows == 0 && cols == 0 {
						stopResize = forwardResize(cmd.Context(), cl, req.SandboxId, s.GetProcessId(), cmd.InOrStdin())
					}
					if jsonOut {
						b, err := marshalJSON(ev, false)
						if err != nil {
							return err
						}
						_, err = fmt.Fprintf(out, "%s\n", b)
						return err
					}
					if b := ev.GetStdout(); len(b) > 0 {
						_, err := out.Write(b)
						return err
					}
					if b := ev.GetStderr(); len(b) > 0 {
						_, err := errOut.Write(b)
						return err
					}
					return nil
				})
				stopResize()
				if err != nil {
					return err
				}
				if jsonOut {
					b, err := marshalJSON(&warrenv1.ExecEvent{Event: &warrenv1.ExecEvent_Result{Result: res}}, false)
					if err != nil {
						return err
					}
					fmt.Fprintf(out, "%s\n", b)
				}
			} else {
				res, err = cl.Exec(cmd.Context(), req)
				if err != nil {
					return err
				}
				if jsonOut {
					if err := printJSON(out, res); err != nil {
						return err
					}
				} else {
					out.Write(res.Stdout)
					errOut.Write(res.Stderr)
				}
			}
			if !jsonOut {
				printExecNotes(errOut, res)
			}
			if code := exitStatus(res); code != 0 {
				return exitError{code}
			}
			return nil
		},
	}
	f := c.Flags()
	f.SetInterspersed(false)
	f.StringVarP(&user, "user", "u", "", "user to run as: name, uid or uid:gid (default root)")
	f.StringVarP(&cwd, "cwd", "w", "", "working directory (default: the sandbox workdir)")
	f.StringArrayVarP(&env, "env", "e", nil, "environment variable KEY=VALUE (repeatable)")
	f.DurationVar(&timeout, "timeout", 0, "kill the command after this long (default: node default)")
	f.BoolVar(&stream, "stream", false, "stream output as it is produced")
	f.StringVar(&shell, "shell", "", "run this string with /bin/sh -c instead of an argv")
	f.BoolVarP(&stdin, "stdin", "i", false, "pass this process's stdin to the command")
	f.StringVar(&outputLimit, "output-limit", "", "keep at most this much of each output stream, e.g. 16Mi (default 1Mi)")
	f.BoolVarP(&background, "background", "d", false, "start as a background process, print its id and return")
	f.BoolVarP(&pty, "pty", "t", false, "run on a terminal (raw bytes, one output stream)")
	f.Uint32Var(&rows, "rows", 0, "terminal rows with --pty (default 24)")
	f.Uint32Var(&cols, "cols", 0, "terminal columns with --pty (default 80)")
	f.StringVar(&idemKey, "idempotency-key", "", "a retry with the same key returns the first result instead of running again")
	return c
}

// exitStatus maps a result to a shell-style exit status.
func exitStatus(r *warrenv1.ExecResult) int {
	switch {
	case r.TimedOut:
		return 124
	case r.Signal != 0:
		return 128 + int(r.Signal)
	case r.ExitCode < 0 || r.ExitCode > 255:
		return 255
	}
	return int(r.ExitCode)
}

// printExecNotes explains on stderr what the output alone does not show.
func printExecNotes(w io.Writer, r *warrenv1.ExecResult) {
	if r.StdoutTruncated {
		fmt.Fprintf(w, "warren: stdout truncated, %d bytes dropped (see --output-limit)\n", r.StdoutDroppedBytes)
	}
	if r.StderrTruncated {
		fmt.Fprintf(w, "warren: stderr truncated, %d bytes dropped (see --output-limit)\n", r.StderrDroppedBytes)
	}
	switch {
	case r.TimedOut:
		fmt.Fprintf(w, "warren: command timed out after %v\n", time.Duration(r.DurationMs)*time.Millisecond)
	case r.OomKilled:
		fmt.Fprintln(w, "warren: command was killed by the out-of-memory killer")
	case r.Signal != 0:
		fmt.Fprintf(w, "warren: command killed by signal %d (%v)\n", r.Signal, syscall.Signal(r.Signal))
	}
}
