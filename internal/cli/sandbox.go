package cli

import (
	"fmt"
	"io"
	"math"
	"slices"
	"strconv"
	"strings"
	"sync"
	"text/tabwriter"
	"time"

	"github.com/spf13/cobra"

	"github.com/warrenrl/warren/client"
	warrenv1 "github.com/warrenrl/warren/gen/warren/v1"
	"github.com/warrenrl/warren/internal/netpolicy"
	"github.com/warrenrl/warren/internal/rlimit"
)

func newSandboxCommand() *cobra.Command {
	c := &cobra.Command{
		Use:     "sandbox",
		Aliases: []string{"sb", "sandboxes"},
		Short:   "Create, inspect and use sandboxes",
		Args:    groupArgs,
		RunE:    groupRun,
	}
	c.AddCommand(
		newCreateCommand(),
		newListCommand(),
		newGetCommand(),
		newRemoveCommand(),
		newExtendCommand(),
		newUpdateCommand(),
		newExecCommand(),
		newPsCommand(),
		newAttachCommand(),
		newKillCommand(),
		newWatchCommand(),
		newStatsCommand(),
		newCopyCommand(),
		newCommitCommand(),
		newEventsCommand(),
		newLogCommand(),
		newPauseCommand(),
		newHibernateCommand(),
		newRestoreCommand(),
		newForkCommand(),
		newResumeCommand(),
		newScreenshotCommand(),
		newInputCommand(),
	)
	return c
}

func newCreateCommand() *cobra.Command {
	var (
		req               warrenv1.CreateRequest
		cpu               float64
		memory, disk      string
		env, labels       []string
		layers            []string
		timeout           time.Duration
		pids              int64
		imageFlag, idFlag string
		workdir, hostname string
		user              string
		backend           string
		ulimits           []string
		network           string
		group             string
		userns            bool
		harness           bool
		maxChildren       int32
	)
	c := &cobra.Command{
		Use:   "create --image IMAGE [flags]",
		Short: "Create a sandbox and print its id",
		Args:  noArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			if imageFlag == "" {
				return usagef("--image is required")
			}
			req.Image, req.Id, req.Workdir, req.Hostname, req.Backend, req.User = imageFlag, idFlag, workdir, hostname, backend, user
			req.Layers = layers
			res := &warrenv1.Resources{PidsMax: pids}
			if cpu < 0 || cpu > math.MaxInt64/1000 {
				return usagef("--cpu must be a positive number of cores")
			}
			res.CpuMillis = int64(math.Round(cpu * 1000))
			if memory != "" {
				n, err := parseBytes(memory)
				if err != nil {
					return usageError{err}
				}
				res.MemoryBytes = n
			}
			if disk != "" {
				n, err := parseBytes(disk)
				if err != nil {
					return usageError{err}
				}
				res.DiskBytes = n
			}
			if res.CpuMillis != 0 || res.MemoryBytes != 0 || res.PidsMax != 0 || res.DiskBytes != 0 {
				req.Resources = res
			}
			var err error
			if req.Env, err = parseKVs("env", env); err != nil {
				return err
			}
			if req.Labels, err = parseKVs("label", labels); err != nil {
				return err
			}
			if req.Rlimits, err = parseUlimits(ulimits); err != nil {
				return err
			}
			if timeout < 0 {
				return usagef("--timeout must not be negative")
			}
			req.TimeoutSeconds = durationSeconds(timeout)
			if network != "" || group != "" {
				if network == "" {
					network = "none"
				}
				if req.Network, err = parseNetwork(network); err != nil {
					return err
				}
				req.Network.Group = group
			}
			cl, err := NewClient(cmd)
			if err != nil {
				return err
			}
			defer cl.Close()
			if cmd.Flags().Changed("userns") {
				req.UserNamespace = &userns
			}
			if harness || cmd.Flags().Changed("max-children") {
				req.Harness = &warrenv1.HarnessOptions{MaxChildren: maxChildren}
			}
			sb, err := cl.Create(cmd.Context(), &req)
			if err != nil {
				return err
			}
			if JSONOutput(cmd) {
				return printJSON(cmd.OutOrStdout(), sb)
			}
			fmt.Fprintln(cmd.OutOrStdout(), sb.Id)
			return nil
		},
	}
	f := c.Flags()
	f.StringVar(&imageFlag, "image", "", "image name (required)")
	f.StringArrayVar(&layers, "layer", nil, "named layer to stack on the image (repeatable; later ones higher)")
	f.StringVar(&idFlag, "id", "", "sandbox id (default: generated)")
	f.StringVar(&backend, "backend", "", "backend: container (the default), fncall (taken ready-made from a pool; no hibernate or fork), microvm or fullvm (a Debian VM with a screen: docs/FULLVM.md)")
	f.Float64Var(&cpu, "cpu", 0, "CPU quota in cores, e.g. 1.5 (default: no quota)")
	f.StringVar(&memory, "memory", "", "memory limit, e.g. 512Mi, 2Gi (default: node default)")
	f.StringVar(&disk, "disk", "", "disk limit of the writable layer, e.g. 1Gi (default: node default; at least 16Mi)")
	f.Int64Var(&pids, "pids", 0, "maximum number of processes (default: node default)")
	f.StringArrayVarP(&env, "env", "e", nil, "environment variable KEY=VALUE (repeatable)")
	f.StringVar(&workdir, "workdir", "", "working directory of commands (default: the image's)")
	f.StringArrayVar(&labels, "label", nil, "label KEY=VALUE (repeatable)")
	f.DurationVar(&timeout, "timeout", 0, "lifetime, after which the sandbox is deleted, e.g. 30m (default: node default)")
	f.StringVar(&hostname, "hostname", "", "hostname inside the sandbox, a DNS name (default: the id, '_' made '-')")
	f.StringArrayVar(&ulimits, "ulimit", nil, "resource limit of the sandbox's processes NAME=SOFT[:HARD], e.g. nofile=1024:4096, core=unlimited (repeatable; default: Debian 12's, shown by sandbox get)")
	f.BoolVar(&req.NoTrajectory, "no-trajectory", false, "record no trajectory log for this sandbox (its execs and file writes skip the log's fdatasync; calls with a seq are refused)")
	f.BoolVar(&req.AllowSetuid, "allow-setuid", false, "let setuid binaries and file capabilities work in the sandbox (sudo as a non-root user): its processes run without no_new_privs; the seccomp filter stays")
	f.BoolVar(&userns, "userns", false, "run the sandbox in a user namespace, root inside being an unprivileged host id (default: the node's, warren serve --userns, on unless the image has files of ids above 65535); --userns=false for one without")
	f.BoolVar(&req.KeepEtc, "keep-etc", false, "keep the image's /etc/hosts, /etc/hostname and /etc/resolv.conf instead of the sandbox's own")
	f.StringVar(&user, "user", "", "who commands run as when they name no user: name, uid or uid:gid (default: the image's user, else root)")
	f.StringVar(&network, "network", "", networkFlagHelp+" (default: none)")
	f.StringVar(&req.Qos, "qos", "", "CPU QoS class: ls (latency-sensitive: more CPU weight, a core of its own where the kernel has core scheduling) or be (best-effort, SCHED_IDLE; the default)")
	f.Int32SliceVar(&req.QosCpus, "qos-cpus", nil, "with --qos ls: pin the sandbox to these CPUs, e.g. 1 or 0,1")
	f.BoolVar(&harness, "harness", false, "make the sandbox a harness: it reaches the API at /dev/warren.sock ($WARREN_ADDR) and may create and drive its own sandboxes there, nothing else; deleting it deletes them")
	f.Int32Var(&maxChildren, "max-children", 0, "with --harness: how many sandboxes it may have at once (default 32)")
	f.StringVar(&group, "network-group", "", "a group of sandboxes on this node that reach each other (every port) whatever their --network, and that nothing else reaches; fixed at create")
	return c
}

const networkFlagHelp = "network: none (loopback only), open (NAT out through the node), or allow:RULE,... with RULE a CIDR or a host name (pypi.org, *.pythonhosted.org) and [:PORT][/tcp|/udp] (only those destinations; names through Warren's resolver)"

// parseNetwork reads --network into the API's policy; the daemon
// validates it.
func parseNetwork(s string) (*warrenv1.NetworkPolicy, error) {
	mode, rules, err := netpolicy.ParseFlag(s)
	if err != nil {
		return nil, usageError{err}
	}
	p := &warrenv1.NetworkPolicy{Mode: mode}
	for _, r := range rules {
		nr := &warrenv1.NetworkRule{Cidr: r.CIDR, Host: r.Host, Protocol: r.Proto}
		if r.HasPort {
			port := r.Port
			nr.Port = &port
		}
		p.Allow = append(p.Allow, nr)
	}
	return p, nil
}

// formatNetwork is a sandbox's policy as --network spells it, and its
// group.
func formatNetwork(p *warrenv1.NetworkPolicy) string {
	if g := p.GetGroup(); g != "" {
		return formatMode(p) + ", group " + g
	}
	return formatMode(p)
}

func formatMode(p *warrenv1.NetworkPolicy) string {
	switch p.GetMode() {
	case "", "none":
		return "none"
	case "open":
		return "open"
	}
	parts := make([]string, len(p.GetAllow()))
	for i, r := range p.GetAllow() {
		parts[i] = r.GetCidr()
		if r.GetHost() != "" {
			parts[i] = r.GetHost()
		}
		if r.Port != nil {
			parts[i] += ":" + strconv.FormatUint(uint64(r.GetPort()), 10)
		}
		if r.GetProtocol() != "" {
			parts[i] += "/" + r.GetProtocol()
		}
	}
	return "allow:" + strings.Join(parts, ",")
}

func newListCommand() *cobra.Command {
	var labels []string
	c := &cobra.Command{
		Use:     "ls [--label k=v]...",
		Aliases: []string{"list"},
		Short:   "List sandboxes",
		Args:    noArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			sel, err := parseKVs("label", labels)
			if err != nil {
				return err
			}
			cl, err := NewClient(cmd)
			if err != nil {
				return err
			}
			defer cl.Close()
			sbs, err := cl.List(cmd.Context(), sel)
			if err != nil {
				return err
			}
			slices.SortFunc(sbs, func(a, b *warrenv1.Sandbox) int { return strings.Compare(a.Id, b.Id) })
			if JSONOutput(cmd) {
				return printJSON(cmd.OutOrStdout(), &warrenv1.ListResponse{Sandboxes: sbs})
			}
			printSandboxTable(cmd.OutOrStdout(), sbs, time.Now())
			return nil
		},
	}
	c.Flags().StringArrayVar(&labels, "label", nil, "only sandboxes with label KEY=VALUE (repeatable; all must match)")
	return c
}

func printSandboxTable(w io.Writer, sbs []*warrenv1.Sandbox, now time.Time) {
	tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "ID\tIMAGE\tSTATE\tCPU\tMEMORY\tAGE\tEXPIRES IN\tLABELS")
	for _, s := range sbs {
		mem := "-"
		if m := s.GetResources().GetMemoryBytes(); m > 0 {
			mem = formatBytes(m)
		}
		fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\n", s.Id, s.Image, stateName(s.State),
			formatCPU(s.GetResources().GetCpuMillis()), mem, formatAge(s.CreatedAtUnixMs, now),
			formatExpiry(s.ExpiresAtUnixMs, now), formatKVs(s.Labels))
	}
	tw.Flush()
}

func newGetCommand() *cobra.Command {
	return &cobra.Command{
		Use:     "get ID",
		Aliases: []string{"inspect"},
		Short:   "Show a sandbox",
		Args:    exactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			cl, err := NewClient(cmd)
			if err != nil {
				return err
			}
			defer cl.Close()
			sb, err := cl.Get(cmd.Context(), args[0])
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
}

func printSandbox(w io.Writer, s *warrenv1.Sandbox, now time.Time) {
	tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
	row := func(k, v string) {
		if v != "" {
			fmt.Fprintf(tw, "%s:\t%s\n", k, v)
		}
	}
	row("ID", s.Id)
	row("Image", s.Image)
	row("Layers", strings.Join(s.Layers, ", "))
	row("Backend", s.Backend)
	row("State", stateName(s.State))
	row("Reason", s.DeadReason)
	row("Hostname", s.Hostname)
	if s.KeepEtc {
		row("Etc", "the image's /etc/hosts, hostname, resolv.conf (--keep-etc)")
	}
	if s.NoTrajectory {
		row("Trajectory", "not recorded (--no-trajectory)")
	}
	if s.UserNamespace {
		row("User ns", fmt.Sprintf("root inside is host id %d (65,536 ids from it)", s.UserIdBase))
	}
	if s.GetQos() != "" {
		q := s.GetQos()
		if len(s.GetQosCpus()) > 0 {
			q += fmt.Sprintf(" (pinned to CPUs %v)", s.GetQosCpus())
		}
		row("QoS", q)
	}
	if s.AllowSetuid {
		row("Setuid", "setuid binaries and file capabilities work (--allow-setuid: no no_new_privs)")
	}
	if h := s.GetHarness(); h != nil {
		row("Harness", fmt.Sprintf("API at /dev/warren.sock for its own sandboxes (at most %d)", h.GetMaxChildren()))
	}
	if s.Parent != "" {
		row("Parent", "harness "+s.Parent+" (deleted with it)")
	}
	row("Workdir", s.Workdir)
	net := formatNetwork(s.GetNetwork())
	if s.NetworkAddress != "" {
		net += " (address " + s.NetworkAddress + ")"
	}
	row("Network", net)
	r := s.GetResources()
	row("CPU", formatCPU(r.GetCpuMillis()))
	if r.GetMemoryBytes() > 0 {
		row("Memory", formatBytes(r.GetMemoryBytes()))
	}
	if r.GetPidsMax() > 0 {
		row("Pids", fmt.Sprint(r.GetPidsMax()))
	}
	if r.GetDiskBytes() > 0 {
		row("Disk", formatBytes(r.GetDiskBytes()))
	}
	row("Created", formatTime(s.CreatedAtUnixMs)+" ("+formatAge(s.CreatedAtUnixMs, now)+" ago)")
	if s.ExpiresAtUnixMs != 0 {
		row("Expires", formatTime(s.ExpiresAtUnixMs)+" (in "+formatExpiry(s.ExpiresAtUnixMs, now)+")")
	} else {
		row("Expires", "never")
	}
	row("Labels", formatKVs(s.Labels))
	row("Env", formatKVs(s.Env))
	row("Ulimits", formatRlimits(s.Rlimits))
	tw.Flush()
}

// parseUlimits reads --ulimit flags (rlimit.Parse) into the API's form.
func parseUlimits(flags []string) ([]*warrenv1.Rlimit, error) {
	var out []*warrenv1.Rlimit
	for _, f := range flags {
		l, err := rlimit.Parse(f)
		if err != nil {
			return nil, usageError{err}
		}
		out = append(out, &warrenv1.Rlimit{Name: l.Name, Soft: apiRlimit(l.Soft), Hard: apiRlimit(l.Hard)})
	}
	return out, nil
}

func apiRlimit(v uint64) int64 {
	if v > math.MaxInt64 {
		return -1 // unlimited
	}
	return int64(v)
}

// formatRlimits lists the limits that are not unlimited, as --ulimit
// takes them.
func formatRlimits(rs []*warrenv1.Rlimit) string {
	var parts []string
	val := func(v int64) string {
		if v < 0 {
			return "unlimited"
		}
		return fmt.Sprint(v)
	}
	for _, r := range rs {
		if r.GetSoft() >= 0 || r.GetHard() >= 0 {
			parts = append(parts, r.GetName()+"="+val(r.GetSoft())+":"+val(r.GetHard()))
		}
	}
	return strings.Join(parts, " ")
}

func newRemoveCommand() *cobra.Command {
	var (
		all    bool
		labels []string
	)
	c := &cobra.Command{
		Use:     "rm ID... | rm --all [--label k=v]...",
		Aliases: []string{"delete", "remove"},
		Short:   "Delete sandboxes",
		RunE: func(cmd *cobra.Command, args []string) error {
			if all == (len(args) > 0) {
				return usagef("give sandbox ids or --all, not both or neither")
			}
			if len(labels) > 0 && !all {
				return usagef("--label only selects sandboxes with --all")
			}
			cl, err := NewClient(cmd)
			if err != nil {
				return err
			}
			defer cl.Close()
			ids := args
			if all {
				sel, err := parseKVs("label", labels)
				if err != nil {
					return err
				}
				sbs, err := cl.List(cmd.Context(), sel)
				if err != nil {
					return err
				}
				for _, s := range sbs {
					ids = append(ids, s.Id)
				}
			}
			return deleteAll(cmd, cl, ids)
		},
	}
	c.Flags().BoolVar(&all, "all", false, "delete every sandbox (with --label: every matching one)")
	c.Flags().StringArrayVar(&labels, "label", nil, "with --all, only sandboxes with label KEY=VALUE (repeatable)")
	return c
}

// deleteAll deletes ids a few at a time, printing each deleted id; it
// reports every failure and fails if any did.
func deleteAll(cmd *cobra.Command, cl *client.Client, ids []string) error {
	var (
		mu     sync.Mutex
		failed int
		wg     sync.WaitGroup
		sem    = make(chan struct{}, 16)
	)
	for _, id := range ids {
		wg.Add(1)
		sem <- struct{}{}
		go func() {
			defer func() { <-sem; wg.Done() }()
			err := cl.Delete(cmd.Context(), id)
			mu.Lock()
			defer mu.Unlock()
			if err != nil {
				failed++
				printError(cmd.ErrOrStderr(), err)
				return
			}
			fmt.Fprintln(cmd.OutOrStdout(), id)
		}()
	}
	wg.Wait()
	if failed > 0 {
		return exitError{1}
	}
	return nil
}

func newCommitCommand() *cobra.Command {
	var keepSetuid bool
	c := &cobra.Command{
		Use:   "commit ID NAME",
		Short: "Make what a sandbox changed on its image a named layer",
		Long: `Turn the writable layer of a running sandbox (every file it created,
changed or deleted on top of its image and layers) into the named layer
NAME, replacing a layer of that name. A sandbox created from the same image
and layers with --layer NAME on top sees the same files. The sandbox's
processes are frozen while its files are read and resume afterwards.

What a sandbox wrote is untrusted: setuid and setgid bits and file
capabilities (security.capability) are stripped from the layer, so that a
file a sandbox left there cannot raise the privileges of users of the
sandboxes made from it. --keep-setuid keeps them (the layer records it).`,
		Args: exactArgs(2),
		RunE: func(cmd *cobra.Command, args []string) error {
			cl, err := NewClient(cmd)
			if err != nil {
				return err
			}
			defer cl.Close()
			start := time.Now()
			l, err := cl.CommitSandboxWith(cmd.Context(), &warrenv1.CommitSandboxRequest{
				SandboxId: args[0], Name: args[1], KeepSetuid: keepSetuid})
			if err != nil {
				return err
			}
			if n := l.GetSetuidStripped(); n > 0 && !JSONOutput(cmd) {
				fmt.Fprintf(cmd.ErrOrStderr(), "stripped setuid/setgid bits or file capabilities of %d files (--keep-setuid keeps them)\n", n)
			}
			return printLayer(cmd, l, start)
		},
	}
	c.Flags().BoolVar(&keepSetuid, "keep-setuid", false, "keep setuid/setgid bits and file capabilities of the sandbox's files")
	return c
}

func newExtendCommand() *cobra.Command {
	var timeout time.Duration
	c := &cobra.Command{
		Use:   "extend ID --timeout DURATION",
		Short: "Set a sandbox's lifetime to end DURATION from now",
		Args:  exactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			if timeout <= 0 {
				return usagef("--timeout must be positive, e.g. 30m")
			}
			cl, err := NewClient(cmd)
			if err != nil {
				return err
			}
			defer cl.Close()
			sb, err := cl.ExtendTimeout(cmd.Context(), args[0], timeout)
			if err != nil {
				return err
			}
			if JSONOutput(cmd) {
				return printJSON(cmd.OutOrStdout(), sb)
			}
			fmt.Fprintf(cmd.OutOrStdout(), "%s expires %s\n", sb.Id, formatTime(sb.ExpiresAtUnixMs))
			return nil
		},
	}
	c.Flags().DurationVar(&timeout, "timeout", 0, "new lifetime from now, e.g. 30m (required)")
	return c
}
