// Package cli implements the warren command line: the daemon (`warren
// serve`) and the client commands, which talk to the daemon only through
// the public client package.
//
// Other packages of the tree add top-level commands from a file of this
// package with AddCommand in an init function, for example
//
//	func init() { AddCommand(newBenchCommand()) }
//
// and reach the daemon from their RunE with NewClient(cmd).
package cli

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"os/signal"
	"strings"
	"syscall"

	"github.com/spf13/cobra"
	"google.golang.org/protobuf/encoding/protojson"
	"google.golang.org/protobuf/proto"

	"github.com/warrenrl/warren/client"
	"github.com/warrenrl/warren/internal/errdefs"
)

var extraCommands []*cobra.Command

// AddCommand registers a top-level command. Call it from an init function.
func AddCommand(c *cobra.Command) { extraCommands = append(extraCommands, c) }

// Execute runs the command line and exits with its status: 0 on success,
// 1 on errors, 2 on usage errors, and the command's status for `exec`.
// SIGINT and SIGTERM cancel the command's context (a second one kills
// the process): in-flight calls are cancelled, `serve` shuts down.
func Execute() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	go func() {
		<-ctx.Done()
		stop()
	}()
	code := Run(ctx, os.Args[1:], os.Stdin, os.Stdout, os.Stderr)
	stop()
	os.Exit(code)
}

// Run runs the command line with args and returns the exit status.
func Run(ctx context.Context, args []string, stdin io.Reader, stdout, stderr io.Writer) int {
	root := NewRootCommand()
	root.SetArgs(args)
	root.SetIn(stdin)
	root.SetOut(stdout)
	root.SetErr(stderr)
	cmd, err := root.ExecuteContextC(ctx)
	if err == nil {
		return 0
	}
	var ex exitError
	if errors.As(err, &ex) {
		return ex.code
	}
	if ctx.Err() != nil && errors.Is(err, context.Canceled) {
		fmt.Fprintln(stderr, "interrupted")
		return 130
	}
	if isUsageError(err) {
		fmt.Fprintf(stderr, "error: %v\n", err)
		if cmd == nil {
			cmd = root
		}
		fmt.Fprintf(stderr, "Run '%s --help' for usage.\n", cmd.CommandPath())
		return 2
	}
	printError(stderr, err)
	return 1
}

// printError prints "error: <category>: <message>" for daemon errors and
// "error: <message>" for local ones.
func printError(w io.Writer, err error) {
	var ce *client.Error
	if errors.As(err, &ce) {
		fmt.Fprintf(w, "error: %s: %s\n", ce.Category, ce.Message)
		return
	}
	if cat := errdefs.CategoryOf(err); cat != errdefs.Unknown {
		fmt.Fprintf(w, "error: %s: %v\n", cat, err)
		return
	}
	fmt.Fprintf(w, "error: %v\n", err)
}

// NewRootCommand builds the command tree.
func NewRootCommand() *cobra.Command {
	root := &cobra.Command{
		Use:           "warren",
		Short:         "Warren runs sandboxes for agentic RL",
		SilenceErrors: true,
		SilenceUsage:  true,
		Args:          groupArgs,
		RunE:          groupRun,
	}
	root.PersistentFlags().String("addr", "", "daemon address: unix:///path, http://host:port or https://... (default $"+client.EnvAddr+" or "+client.DefaultAddr+")")
	root.PersistentFlags().Bool("json", false, "print machine-readable JSON (the API's protobuf JSON)")
	root.SetFlagErrorFunc(func(_ *cobra.Command, err error) error { return usageError{err} })
	root.CompletionOptions.DisableDefaultCmd = true

	root.AddCommand(
		newServeCommand(),
		newGatewayCommand(),
		newNodesCommand(),
		newVersionCommand(),
		newSandboxCommand(),
		newImageCommand(),
	)
	for _, c := range extraCommands {
		root.AddCommand(c)
	}
	return root
}

// NewClient returns a client of the daemon named by the --addr flag (or
// $WARREN_ADDR, or the default socket).
func NewClient(cmd *cobra.Command) (*client.Client, error) {
	addr, _ := cmd.Flags().GetString("addr")
	return client.New(addr, client.WithUserAgent("warren-cli/"+version()))
}

// JSONOutput reports whether --json was given.
func JSONOutput(cmd *cobra.Command) bool {
	j, _ := cmd.Flags().GetBool("json")
	return j
}

// usageError marks errors that exit with status 2.
type usageError struct{ err error }

func (e usageError) Error() string { return e.err.Error() }
func (e usageError) Unwrap() error { return e.err }

func usagef(format string, args ...any) error { return usageError{fmt.Errorf(format, args...)} }

func isUsageError(err error) bool {
	var ue usageError
	if errors.As(err, &ue) {
		return true
	}
	// Errors cobra raises itself before our code runs.
	msg := err.Error()
	return strings.HasPrefix(msg, "unknown command") || strings.HasPrefix(msg, "required flag") ||
		strings.HasPrefix(msg, "unknown flag") || strings.HasPrefix(msg, "unknown shorthand flag") ||
		strings.HasPrefix(msg, "if any flags in the group")
}

// exitError ends the program with a status and no message.
type exitError struct{ code int }

func (e exitError) Error() string { return fmt.Sprintf("exit status %d", e.code) }

// Argument validators that produce usage errors.
func exactArgs(n int) cobra.PositionalArgs {
	return func(cmd *cobra.Command, args []string) error {
		if len(args) != n {
			return usagef("%s takes %d argument(s), got %d", cmd.CommandPath(), n, len(args))
		}
		return nil
	}
}

func minArgs(n int) cobra.PositionalArgs {
	return func(cmd *cobra.Command, args []string) error {
		if len(args) < n {
			return usagef("%s takes at least %d argument(s), got %d", cmd.CommandPath(), n, len(args))
		}
		return nil
	}
}

func noArgs(cmd *cobra.Command, args []string) error {
	if len(args) > 0 {
		return usagef("%s takes no arguments, got %q", cmd.CommandPath(), args[0])
	}
	return nil
}

// groupArgs and groupRun make a command with subcommands print its help
// when called bare and reject unknown subcommands.
func groupArgs(cmd *cobra.Command, args []string) error {
	if len(args) > 0 {
		return usagef("unknown command %q for %q", args[0], cmd.CommandPath())
	}
	return nil
}

func groupRun(cmd *cobra.Command, _ []string) error {
	return cmd.Help()
}

// printJSON prints a proto message as protobuf JSON, indented, with zero
// values included (an exit code of 0 is "exitCode": 0, not absent). The
// output is normalised: protojson deliberately varies its whitespace.
func printJSON(w io.Writer, m proto.Message) error {
	b, err := marshalJSON(m, true)
	if err != nil {
		return err
	}
	_, err = w.Write(append(b, '\n'))
	return err
}

// marshalJSON returns m as protobuf JSON with stable formatting.
func marshalJSON(m proto.Message, indent bool) ([]byte, error) {
	raw, err := protojson.MarshalOptions{EmitUnpopulated: true}.Marshal(m)
	if err != nil {
		return nil, err
	}
	var buf bytes.Buffer
	if indent {
		err = json.Indent(&buf, raw, "", "  ")
	} else {
		err = json.Compact(&buf, raw)
	}
	return buf.Bytes(), err
}
