package cli

import (
	"math"
	"time"

	"github.com/spf13/cobra"

	"github.com/warrenrl/warren/client"
)

func newUpdateCommand() *cobra.Command {
	var (
		cpu          float64
		memory       string
		pids         int64
		timeout      time.Duration
		labels       []string
		removeLabels []string
		network      string
		qos          string
		qosCPUs      []int
	)
	c := &cobra.Command{
		Use:   "update ID [--cpu CORES] [--memory SIZE] [--pids N] [--timeout DURATION] [--label k=v]... [--remove-label k]... [--network POLICY] [--qos ls|be [--qos-cpus LIST]]",
		Short: "Change a running sandbox's limits, lifetime or labels (all or nothing)",
		Long: "Change a running sandbox's limits, lifetime, labels, network or QoS class. Only the flags given change;\n" +
			"--cpu 0 lifts the CPU quota, --memory 0 and --pids 0 restore the node defaults.\n" +
			"Nothing changes when the node cannot honour the whole update.",
		Args: exactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			var u client.SandboxUpdate
			f := cmd.Flags()
			if f.Changed("cpu") {
				if cpu < 0 || cpu > math.MaxInt64/1000 {
					return usagef("--cpu must be a positive number of cores (0: no quota)")
				}
				n := int64(math.Round(cpu * 1000))
				u.CPUMillis = &n
			}
			if f.Changed("memory") {
				n, err := parseBytes(memory)
				if err != nil {
					return usageError{err}
				}
				u.MemoryBytes = &n
			}
			if f.Changed("pids") {
				u.PidsMax = &pids
			}
			if f.Changed("timeout") {
				if timeout < 0 {
					return usagef("--timeout must not be negative, e.g. 30m")
				}
				u.Timeout = &timeout
			}
			var err error
			if u.SetLabels, err = parseKVs("label", labels); err != nil {
				return err
			}
			u.RemoveLabels = removeLabels
			if f.Changed("network") {
				if u.Network, err = parseNetwork(network); err != nil {
					return err
				}
			}
			if f.Changed("qos") {
				u.QoS = &qos
				for _, c := range qosCPUs {
					u.QoSCPUs = append(u.QoSCPUs, int32(c))
				}
			} else if f.Changed("qos-cpus") {
				return usagef("--qos-cpus changes with --qos")
			}
			cl, err := NewClient(cmd)
			if err != nil {
				return err
			}
			defer cl.Close()
			sb, err := cl.Update(cmd.Context(), args[0], u)
			if err != nil {
				return err
			}
			if JSONOutput(cmd) {
				return printJSON(cmd.OutOrStdout(), sb)
			}
			printSandbox(cmd.OutOrStdout(), sb, time.Now())
			return nil
		},
	}
	f := c.Flags()
	f.Float64Var(&cpu, "cpu", 0, "CPU quota in cores, e.g. 1.5 (0: no quota)")
	f.StringVar(&memory, "memory", "", "memory limit, e.g. 512Mi, 2Gi (0: node default)")
	f.Int64Var(&pids, "pids", 0, "maximum number of processes (0: node default)")
	f.DurationVar(&timeout, "timeout", 0, "new lifetime from now, e.g. 30m (0: node default)")
	f.StringArrayVar(&labels, "label", nil, "set label KEY=VALUE (repeatable)")
	f.StringVar(&network, "network", "", networkFlagHelp+"; applies at once and cuts established connections the new policy forbids")
	f.StringVar(&qos, "qos", "", "CPU QoS class, applied to the running processes at once: ls (latency-sensitive) or be (best-effort)")
	f.IntSliceVar(&qosCPUs, "qos-cpus", nil, "with --qos ls: pin the sandbox to these CPUs, e.g. 1 or 0,1 (absent: unpinned)")
	f.StringArrayVar(&removeLabels, "remove-label", nil, "remove label KEY (repeatable)")
	return c
}
