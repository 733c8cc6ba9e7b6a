package cli

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"runtime"
	"strings"
	"time"

	"github.com/spf13/cobra"

	warrenv1 "github.com/warrenrl/warren/gen/warren/v1"
)

func newVersionCommand() *cobra.Command {
	return &cobra.Command{
		Use:   "version",
		Short: "Print the client's and, if reachable, the daemon's version",
		Args:  noArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			local := &warrenv1.VersionResponse{Version: version(), Commit: commit()}
			var srv *warrenv1.VersionResponse
			var srvErr error
			cl, err := NewClient(cmd)
			if err == nil {
				ctx, cancel := context.WithTimeout(cmd.Context(), 5*time.Second)
				srv, srvErr = cl.Version(ctx)
				cancel()
				cl.Close()
			} else {
				srvErr = err
			}
			out := cmd.OutOrStdout()
			if JSONOutput(cmd) {
				// {"client": {...}, "server": {...}} with protobuf JSON values.
				c, _ := marshalJSON(local, false)
				s := []byte("null")
				if srv != nil {
					s, _ = marshalJSON(srv, false)
				}
				var buf bytes.Buffer
				json.Indent(&buf, fmt.Appendf(nil, `{"client":%s,"server":%s}`, c, s), "", "  ")
				buf.WriteByte('\n')
				_, err := out.Write(buf.Bytes())
				return err
			}
			fmt.Fprintf(out, "Client: %s%s (%s, %s/%s)\n", local.Version, commitSuffix(local.Commit), runtime.Version(), runtime.GOOS, runtime.GOARCH)
			if srv == nil {
				fmt.Fprintf(out, "Server: unreachable (%v)\n", srvErr)
				return nil
			}
			fmt.Fprintf(out, "Server: %s%s (backends: %s; cgroup %s)\n", srv.Version, commitSuffix(srv.Commit), strings.Join(srv.Backends, ", "), srv.CgroupMode)
			fmt.Fprintf(out, "GPUs:   %s\n", gpuSummary(srv.Gpus))
			fmt.Fprintf(out, "QoS:    %s\n", qosSummary(srv))
			return nil
		},
	}
}

// qosSummary says which CPU QoS mechanisms the node has.
func qosSummary(v *warrenv1.VersionResponse) string {
	yes := func(b bool) string {
		if b {
			return "yes"
		}
		return "no"
	}
	return "cpu.idle for be: " + yes(v.GetCpuIdle()) + "; core scheduling for ls: " + yes(v.GetCoreScheduling())
}

// gpuSummary is one line: each GPU with its device and the jobs on it.
func gpuSummary(gpus []*warrenv1.NodeGpu) string {
	if len(gpus) == 0 {
		return "none"
	}
	parts := make([]string, len(gpus))
	for i, g := range gpus {
		use := "free"
		switch {
		case g.Exclusive:
			use = "exclusive job"
		case g.SharedJobs > 0:
			use = fmt.Sprintf("%d shared jobs", g.SharedJobs)
		}
		parts[i] = fmt.Sprintf("%d (%s, %s)", g.Index, g.Device, use)
	}
	return fmt.Sprintf("%d: %s", len(gpus), strings.Join(parts, "; "))
}

func commitSuffix(c string) string {
	if c == "" {
		return ""
	}
	if len(c) > 12 {
		c = c[:12]
	}
	return " " + c
}
