package cli

import (
	"bufio"
	"bytes"
	"encoding/json"

	"github.com/spf13/cobra"
	"google.golang.org/protobuf/encoding/protojson"

	warrenv1 "github.com/warrenrl/warren/gen/warren/v1"
)

func newLogCommand() *cobra.Command {
	var session string
	c := &cobra.Command{
		Use:   "log ID",
		Short: "Export a sandbox's trajectory log (its execs and file writes) as JSON lines",
		Long: `Print a sandbox's trajectory log, one JSON object (a TrajectoryEntry of
the API) a line, in the order the outcomes were recorded: every exec and
file write with its session, sequence number, request (payloads as their
length and SHA-256), result or error, and timing. A step the daemon
stopped during has "interrupted": true. The log is read page by page, so
a long one is not held in memory.`,
		Args: exactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			cl, err := NewClient(cmd)
			if err != nil {
				return err
			}
			defer cl.Close()
			w := bufio.NewWriter(cmd.OutOrStdout())
			defer w.Flush()
			req := &warrenv1.ReadTrajectoryRequest{SandboxId: args[0], SessionId: session, PageSize: 1000}
			for {
				res, err := cl.ReadTrajectory(cmd.Context(), req)
				if err != nil {
					return err
				}
				for _, e := range res.GetEntries() {
					raw, err := protojson.MarshalOptions{UseProtoNames: true}.Marshal(e)
					if err != nil {
						return err
					}
					var line bytes.Buffer
					if err := json.Compact(&line, raw); err != nil {
						return err
					}
					line.WriteByte('\n')
					if _, err := w.Write(line.Bytes()); err != nil {
						return err
					}
				}
				if req.PageToken = res.GetNextPageToken(); req.PageToken == "" {
					return nil
				}
			}
		},
	}
	c.Flags().StringVar(&session, "session", "", "only this session's steps")
	return c
}
