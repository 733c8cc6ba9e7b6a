package cli

import (
	"text/tabwriter"

	"bytes"
	"fmt"
	warrenv1 "github.com/warrenrl/warren/gen/warren/v1"
	"log/slog"
	"net"
	"os"
	"regexp"
	"strings"
	"time"

	"github.com/spf13/cobra"
	"github.com/spf13/pflag"

	"github.com/warrenrl/warren/internal/gateway"
	"github.com/warrenrl/warren/internal/membership"
	"github.com/warrenrl/warren/internal/server"
	"github.com/warrenrl/warren/internal/ui"
)

// clusterOptions are the gossip flags of `warren serve` and `warren
// gateway`.
type clusterOptions struct {
	gossip, advertise string
	keyFile           string
	peers             []string
}

func (c *clusterOptions) flags(f *pflag.FlagSet) {
	f.StringVar(&c.gossip, "gossip", "", fmt.Sprintf("gossip address (UDP and TCP) of the cluster's membership, host:port (default 0.0.0.0:%d when --join is given)", membership.DefaultPort))
	f.StringVar(&c.advertise, "gossip-advertise", "", "the gossip address other members reach this one at (default: --gossip's, or the first private address)")
	f.StringVar(&c.keyFile, "gossip-key-file", "", "file whose content every member of the cluster shares: gossip is encrypted and authenticated with it (without it anyone reaching the gossip port can join the pool as a node)")
	f.StringSliceVar(&c.peers, "join", nil, "gossip addresses (host:port; repeatable or comma-separated) of cluster members to join; retried until one answers")
}

func (c *clusterOptions) enabled() bool { return c.gossip != "" || len(c.peers) > 0 }

func (c *clusterOptions) join(name string, meta membership.Meta, onChange func(), log *slog.Logger) (*membership.Pool, error) {
	var key []byte
	if c.keyFile != "" {
		var err error
		if key, err = os.ReadFile(c.keyFile); err != nil {
			return nil, fmt.Errorf("--gossip-key-file: %w", err)
		}
		if len(bytes.TrimSpace(key)) == 0 {
			return nil, usagef("--gossip-key-file %s is empty", c.keyFile)
		}
	} else {
		log.Warn("cluster gossip is neither encrypted nor authenticated: pass --gossip-key-file")
	}
	return membership.Join(membership.Options{Name: name, Meta: meta, Bind: c.gossip, Advertise: c.advertise, Peers: c.peers, OnChange: onChange, Key: key, Logger: log})
}

var tagRE = regexp.MustCompile(`^[a-z2-7]+$`)

// clusterNode checks a node's cluster flags and returns its id tag.
func (o serveOptions) clusterNode() (string, error) {
	if o.nodeName == "" {
		return "", usagef("a node in a cluster needs --node-name")
	}
	if o.listen == "" {
		return "", usagef("a node in a cluster needs --listen: gateways reach its API over TCP")
	}
	tag := o.nodeTag
	if tag == "" {
		tag = gateway.TagOf(o.nodeName)
	}
	if len(tag) != gateway.TagLen || !tagRE.MatchString(tag) {
		return "", usagef("--node-tag %q: want %d characters of [a-z2-7]", tag, gateway.TagLen)
	}
	return tag, nil
}

// apiAddr is where gateways reach the node's API.
func (o serveOptions) apiAddr() string {
	if o.clusterAPI != "" {
		return o.clusterAPI
	}
	return "http://" + o.listen
}

type gatewayOptions struct {
	name, listen, socket     string
	tokenFile, nodeTokenFile string
	insecureNoAuth           bool
	noUI                     bool
	cluster                  clusterOptions
	pullInterval, downAfter  time.Duration
	listInterval             time.Duration
	overcommit               float64
	logLevel, logFormat      string
	stallTimeout             time.Duration
	e2bAddr, e2bKeyFile      string
}

func newGatewayCommand() *cobra.Command {
	var o gatewayOptions
	c := &cobra.Command{
		Use:   "gateway",
		Short: "Run a cluster gateway: the node API over many nodes",
		Long: `Run a cluster gateway: it serves the same API as a node (so the CLI and
the SDKs work unchanged against it), places creates on the nodes of the
gossip pool it joins and routes each call on a sandbox to its node, which
the sandbox's id names. Several gateways may run side by side; none keeps
state a call depends on. docs/ARCHITECTURE.md, "The cluster".`,
		Args: noArgs,
		RunE: func(cmd *cobra.Command, _ []string) error { return runGateway(cmd, o) },
	}
	f := c.Flags()
	host, _ := os.Hostname()
	f.StringVar(&o.name, "name", host+"-gateway", "the gateway's name in the gossip pool (unique)")
	f.StringVar(&o.listen, "listen", "", "TCP address to serve the API on, e.g. 0.0.0.0:7070 (needs a token)")
	f.StringVar(&o.socket, "socket", "", "also serve on this unix socket")
	f.StringVar(&o.tokenFile, "token-file", "", "file holding the bearer token clients must send (default $WARREN_TOKEN)")
	f.StringVar(&o.nodeTokenFile, "node-token-file", "", "file holding the bearer token of the nodes' APIs (default: --token-file's)")
	f.BoolVar(&o.insecureNoAuth, "insecure-no-auth", false, "allow --listen without a token")
	f.BoolVar(&o.noUI, "no-ui", false, "do not serve the web dashboard at /ui (docs/UI.md)")
	f.DurationVar(&o.pullInterval, "pull-interval", time.Second, "how often each node's report is pulled")
	f.DurationVar(&o.listInterval, "list-interval", 5*time.Second, "how often each node's sandbox list is pulled: what is reported lost when the node goes down (sandboxes made through this gateway since count too)")
	f.DurationVar(&o.downAfter, "down-after", 3*time.Second, "a node that has not reported for this long is down: its sandboxes are listed lost and creates avoid it")
	f.Float64Var(&o.overcommit, "overcommit", 4, "CPU and memory over-commit ratio of placement")
	f.StringVar(&o.logLevel, "log-level", "info", "log level: debug, info, warn, error")
	f.StringVar(&o.logFormat, "log-format", "text", "log format: text or json")
	f.DurationVar(&o.stallTimeout, "stall-timeout", server.DefaultStallTimeout, "cut an archive transfer whose client moves no data for this long")
	f.StringVar(&o.e2bAddr, "e2b-addr", "", "also serve the E2B-compatible API (docs/E2B.md) on this TCP address, e.g. 0.0.0.0:3000, routing each call to the sandbox's node; needs --e2b-api-key-file")
	f.StringVar(&o.e2bKeyFile, "e2b-api-key-file", "", "file of the API keys the E2B API accepts (X-API-Key), one e2b_<hex> per line; every gateway of the cluster needs the same file (sandboxes' envd tokens derive from it)")
	o.cluster.flags(f)
	return c
}

func runGateway(cmd *cobra.Command, o gatewayOptions) error {
	log, err := newLogger(serveOptions{logLevel: o.logLevel, logFormat: o.logFormat}, cmd)
	if err != nil {
		return err
	}
	slog.SetDefault(log)
	if o.listen == "" && o.socket == "" {
		return usagef("a gateway needs --listen or --socket")
	}
	if (o.e2bAddr == "") != (o.e2bKeyFile == "") {
		return usagef("--e2b-addr and --e2b-api-key-file go together")
	}
	token, err := readToken(o.tokenFile)
	if err != nil {
		return err
	}
	nodeToken := token
	if o.nodeTokenFile != "" {
		if nodeToken, err = readToken(o.nodeTokenFile); err != nil {
			return err
		}
	}
	if o.cluster.gossip == "" {
		o.cluster.gossip = net.JoinHostPort("0.0.0.0", fmt.Sprint(membership.DefaultPort))
	}
	var dash server.UIFactory
	if !o.noUI {
		d, err := ui.New(ui.Options{Logger: log, Role: "gateway"})
		if err != nil {
			return err
		}
		defer d.Close()
		dash = d.Handler
	}
	srv, err := server.New(server.Config{SocketPath: o.socket, ListenAddr: o.listen, Token: token, InsecureNoAuth: o.insecureNoAuth,
		Logger: log, StallTimeout: o.stallTimeout, UI: dash})
	if err != nil {
		return err
	}
	if err := srv.Listen(); err != nil {
		return err
	}
	defer srv.Close()
	var gw *gateway.Gateway
	ready := make(chan struct{})
	pool, err := o.cluster.join(o.name, membership.Meta{Role: membership.RoleGateway}, func() {
		<-ready
		gw.Refresh()
	}, log)
	if err != nil {
		return err
	}
	defer func() {
		if cerr := pool.Close(); cerr != nil {
			log.Warn("leaving the cluster", "err", cerr)
		}
	}()
	gw = gateway.New(gateway.Options{Name: o.name, Members: pool, NodeToken: nodeToken, PullInterval: o.pullInterval, ListInterval: o.listInterval,
		DownAfter: o.downAfter, Overcommit: o.overcommit, Logger: log})
	close(ready)
	defer gw.Close()
	srv.SetMetrics(gw.MetricsHandler())
	// Serve once a node has reported (calls before it would be refused
	// as Unavailable anyway); a cluster with no node up yet is served
	// after a while, answering Unavailable until one reports.
	select {
	case <-gw.Ready():
	case <-time.After(10 * time.Second):
		log.Warn("no node has reported yet; serving anyway")
	case <-cmd.Context().Done():
		return cmd.Context().Err()
	}
	if o.e2bAddr != "" {
		stop, err := serveE2B(o.e2bAddr, o.e2bKeyFile, gw, log)
		if err != nil {
			return err
		}
		// Deferred after the gateway's Close, so it runs first.
		defer stop()
	}
	log.Info("warren gateway started", "name", o.name, "gossip", pool.Addr(), "join", strings.Join(o.cluster.peers, ","))
	return srv.Serve(cmd.Context(), gw)
}

func newNodesCommand() *cobra.Command {
	return &cobra.Command{
		Use:   "nodes",
		Short: "List the cluster's nodes as the gateway sees them (or the node's own report)",
		Args:  noArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			cl, err := NewClient(cmd)
			if err != nil {
				return err
			}
			defer cl.Close()
			nodes, err := cl.NodeStatus(cmd.Context())
			if err != nil {
				return err
			}
			if JSONOutput(cmd) {
				return printJSON(cmd.OutOrStdout(), &warrenv1.NodeStatusResponse{Nodes: nodes})
			}
			tw := tabwriter.NewWriter(cmd.OutOrStdout(), 0, 4, 2, ' ', 0)
			fmt.Fprintln(tw, "NAME\tTAG\tUP\tSANDBOXES\tCPU ALLOC/CAP\tMEMORY ALLOC/CAP\tLOAD\tLAYERS\tADDRESS")
			for _, n := range nodes {
				fmt.Fprintf(tw, "%s\t%s\t%v\t%d\t%s/%s\t%s/%s\t%.2f\t%d\t%s\n", n.GetName(), n.GetTag(), n.GetUp(), n.GetSandboxes(),
					formatCPU(n.GetAllocCpuMillis()), formatCPU(n.GetCpuMillis()), formatBytes(n.GetAllocMemoryBytes()), formatBytes(n.GetMemoryBytes()),
					n.GetLoad(), len(n.GetLayers()), n.GetAddress())
			}
			return tw.Flush()
		},
	}
}
