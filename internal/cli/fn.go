package cli

import (
	"fmt"
	"io"
	"os"
	"strings"
	"time"

	"github.com/spf13/cobra"

	warrenv1 "github.com/warrenrl/warren/gen/warren/v1"
)

func init() { AddCommand(newFnCommand()) }

func newFnCommand() *cobra.Command {
	c := &cobra.Command{
		Use:   "fn",
		Short: "Run jobs in the fncall backend's pooled environments",
		Args:  groupArgs,
		RunE:  groupRun,
	}
	c.AddCommand(newFnRunCommand())
	return c
}

func newFnRunCommand() *cobra.Command {
	var (
		image, backendName, memory, output, fileSize, fileOut, disk string
		cpu, wall                                                   time.Duration
		procs, openFiles                                            int32
		env, files, outputs                                         []string
		stdin                                                       bool
		gpus                                                        int32
		sharedGPU                                                   bool
	)
	c := &cobra.Command{
		Use:   "run --image IMAGE [flags] -- ARGV...",
		Short: "Run a command as a one-step job in a fresh isolated environment",
		Long: `Run a command as a one-step job of the fncall backend: in a fresh,
isolated environment of the image, as uid 1000 in the empty work
directory /w, without network, within the limits given.

The command's stdout and stderr go to this process's; the step's status
(accepted, non_zero_exit, signalled, time_limit, memory_limit,
output_limit, file_error, internal_error), CPU and wall time and peak
memory go to stderr, and the exit status is the command's (128+signal
when signalled, 124 past a time limit, 125 for other statuses).
--file NAME=PATH copies a local file in; --output NAME prints an output
file of /w after the step.`,
		Args: minArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			if image == "" {
				return usagef("--image is required")
			}
			step := &warrenv1.RunStep{Argv: args, Outputs: outputs, Limits: &warrenv1.RunLimits{
				CpuMs: cpu.Milliseconds(), WallMs: wall.Milliseconds(), Processes: procs, OpenFiles: openFiles}}
			var err error
			if step.Env, err = parseKVs("env", env); err != nil {
				return err
			}
			for _, b := range []struct {
				s   string
				dst *int64
			}{{memory, &step.Limits.MemoryBytes}, {output, &step.Limits.OutputBytes}, {fileSize, &step.Limits.FileSizeBytes}, {fileOut, &step.Limits.FileOutBytes}, {disk, &step.Limits.DiskBytes}} {
				if b.s != "" {
					if *b.dst, err = parseBytes(b.s); err != nil {
						return usageError{err}
					}
				}
			}
			for _, f := range files {
				name, p, ok := strings.Cut(f, "=")
				if !ok || name == "" || p == "" {
					return usagef("--file takes NAME=PATH")
				}
				data, err := os.ReadFile(p)
				if err != nil {
					return err
				}
				step.Files = append(step.Files, &warrenv1.RunFile{Name: name, Data: data})
			}
			if stdin {
				b, err := io.ReadAll(io.LimitReader(cmd.InOrStdin(), maxStdin+1))
				if err != nil {
					return fmt.Errorf("read stdin: %w", err)
				}
				if len(b) > maxStdin {
					return fmt.Errorf("stdin is larger than %d bytes", maxStdin)
				}
				step.Stdin = b
			}
			cl, err := NewClient(cmd)
			if err != nil {
				return err
			}
			defer cl.Close()
			req := &warrenv1.RunRequest{Image: image, Backend: backendName, Steps: []*warrenv1.RunStep{step}}
			if gpus != 0 || sharedGPU {
				req.Gpus = &warrenv1.RunGpus{Count: gpus, Shared: sharedGPU}
			}
			res, err := cl.Run(cmd.Context(), req)
			if err != nil {
				return err
			}
			r := res.GetSteps()[0]
			if JSONOutput(cmd) {
				if err := printJSON(cmd.OutOrStdout(), res); err != nil {
					return err
				}
			} else {
				_, _ = cmd.OutOrStdout().Write(r.GetStdout())
				_, _ = cmd.ErrOrStderr().Write(r.GetStderr())
				for _, f := range r.GetFiles() {
					if f.GetError() != "" {
						fmt.Fprintf(cmd.ErrOrStderr(), "output %s: %s\n", f.GetName(), f.GetError())
						continue
					}
					fmt.Fprintf(cmd.OutOrStdout(), "--- %s\n", f.GetName())
					_, _ = cmd.OutOrStdout().Write(f.GetData())
				}
				status := strings.ToLower(strings.TrimPrefix(r.GetStatus().String(), "RUN_STATUS_"))
				fmt.Fprintf(cmd.ErrOrStderr(), "status %s", status)
				if r.GetError() != "" {
					fmt.Fprintf(cmd.ErrOrStderr(), " (%s)", r.GetError())
				}
				fmt.Fprintf(cmd.ErrOrStderr(), ", cpu %s, wall %s, peak memory %s\n",
					time.Duration(r.GetCpuUs())*time.Microsecond, time.Duration(r.GetWallUs())*time.Microsecond, formatBytes(r.GetPeakMemoryBytes()))
			}
			if code := fnExitCode(r); code != 0 {
				return exitError{code}
			}
			return nil
		},
	}
	f := c.Flags()
	f.StringVar(&image, "image", "", "image to run in (required)")
	f.StringVar(&backendName, "backend", "", `backend (default "fncall")`)
	f.DurationVar(&cpu, "cpu", 0, "CPU time limit (default 10s)")
	f.DurationVar(&wall, "wall", 0, "wall time limit (default 2 x cpu + 1s)")
	f.StringVar(&memory, "memory", "", "peak memory limit, e.g. 256MiB")
	f.Int32Var(&procs, "procs", 0, "processes of the job's user (default 64)")
	f.StringVar(&output, "output-limit", "", "bytes per output stream (default 64KiB)")
	f.StringVar(&fileSize, "file-size", "", "largest file the command may write (default 64MiB)")
	f.StringVar(&fileOut, "output-file-limit", "", "largest output file read back (default 64KiB)")
	f.StringVar(&disk, "disk", "", "everything the job may write in all, e.g. 64MiB (default: the node's --fn-disk-bytes)")
	f.Int32Var(&openFiles, "open-files", 0, "open files (default 256)")
	f.StringArrayVarP(&env, "env", "e", nil, "KEY=VALUE environment variable (repeatable)")
	f.StringArrayVar(&files, "file", nil, "NAME=PATH: copy a local file into /w (repeatable)")
	f.StringArrayVar(&outputs, "output", nil, "a file of /w to print after the step (repeatable)")
	f.BoolVarP(&stdin, "stdin", "i", false, "send this process's stdin to the command")
	f.Int32Var(&gpus, "gpus", 0, "GPUs the job gets (waits until they are free; warren version lists the node's)")
	f.BoolVar(&sharedGPU, "shared-gpu", false, "share the GPUs with other shared jobs instead of holding them alone")
	return c
}

// fnExitCode is the exit status `fn run` ends with.
func fnExitCode(r *warrenv1.RunStepResult) int {
	switch r.GetStatus() {
	case warrenv1.RunStatus_RUN_STATUS_ACCEPTED:
		return 0
	case warrenv1.RunStatus_RUN_STATUS_NON_ZERO_EXIT:
		return int(r.GetExitCode())
	case warrenv1.RunStatus_RUN_STATUS_SIGNALLED:
		return 128 + int(r.GetSignal())
	case warrenv1.RunStatus_RUN_STATUS_TIME_LIMIT:
		return 124
	}
	return 125
}
