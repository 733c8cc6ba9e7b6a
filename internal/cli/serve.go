package cli

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net/netip"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"time"

	"github.com/spf13/cobra"
	"golang.org/x/sys/unix"

	"github.com/warrenrl/warren/client"
	"github.com/warrenrl/warren/internal/backend"
	"github.com/warrenrl/warren/internal/container"
	"github.com/warrenrl/warren/internal/daemon"
	"github.com/warrenrl/warren/internal/e2b"
	"github.com/warrenrl/warren/internal/erofs"
	"github.com/warrenrl/warren/internal/events"
	"github.com/warrenrl/warren/internal/fncall"
	"github.com/warrenrl/warren/internal/fullvm"
	"github.com/warrenrl/warren/internal/gateway"
	"github.com/warrenrl/warren/internal/image"
	"github.com/warrenrl/warren/internal/kaudit"
	"github.com/warrenrl/warren/internal/membership"
	"github.com/warrenrl/warren/internal/metrics"
	"github.com/warrenrl/warren/internal/microvm"
	"github.com/warrenrl/warren/internal/netpolicy"
	"github.com/warrenrl/warren/internal/resolver"
	"github.com/warrenrl/warren/internal/server"
	"github.com/warrenrl/warren/internal/ui"
)

// version and commit identify this build; they are the daemon's, set with
// -ldflags "-X github.com/warrenrl/warren/internal/daemon.Version=...".
func version() string { return daemon.Version }
func commit() string  { return daemon.Commit }

type serveOptions struct {
	stateDir, socket, runDir string
	imageStore               string
	listen, tokenFile        string
	insecureNoAuth           bool
	noUI                     bool
	defaultTimeout           time.Duration
	defaultDisk              string
	fnDisk                   string
	eventLogBytes            string
	trajectoryBytes          string
	noTrajectory             bool
	trajectoryFsync          bool
	diskReserve              string
	guardInterval            time.Duration
	idleReclaimAfter         time.Duration
	logLevel, logFormat      string
	cgroupParent             string
	layerDirectIO            bool
	layerReadAheadKB         int
	mkfsErofs                string
	pprofAddr                string
	stallTimeout             time.Duration
	harnessCallRate          float64
	harnessCallBurst         int
	seccomp                  bool
	userns                   bool
	lazyPages                bool
	unprivUserfaultfd        bool
	microVM                  bool
	microVMPmem              bool
	vmTransport              string
	vmAccel                  string
	fullVM                   bool
	fullVMImage              string
	guestAgent               string
	usernsIDs                string
	cpuAffinity              bool
	networkSubnet            string
	dnsUpstreams             []string
	gpuDevices, gpuLibs      []string
	noGPUs                   bool
	cluster                  clusterOptions
	nodeTag                  string
	clusterAPI               string
	maxSandboxes             int
	cpuOvercommit            float64
	memoryOvercommit         float64
	checkpointDir            string
	nodeName                 string
	e2bAddr, e2bKeyFile      string
}

func newServeCommand() *cobra.Command {
	var o serveOptions
	c := &cobra.Command{
		Use:   "serve",
		Short: "Run the Warren daemon",
		Long: `Run the Warren daemon: the API on a unix socket (mode 0600) and, with
--listen, on TCP with bearer-token auth. SIGTERM or SIGINT shuts it down
gracefully; sandboxes keep running and the next daemon adopts them.`,
		Args: noArgs,
		RunE: func(cmd *cobra.Command, _ []string) error { return runServe(cmd, o) },
	}
	f := c.Flags()
	f.StringVar(&o.stateDir, "state-dir", daemon.DefaultStateDir, "state directory (sandbox records, images, writable layers)")
	f.StringVar(&o.socket, "socket", server.DefaultSocket, "unix socket to serve the API on")
	f.StringVar(&o.runDir, "run-dir", "/run/warren", "runtime directory (mount points, agent sockets, layer mounts; tmpfs)")
	f.StringVar(&o.imageStore, "image-store", "", "image store directory: EROFS layer blobs and image records; may be on a filesystem shared by several nodes (default <state-dir>/images)")
	f.StringVar(&o.checkpointDir, "checkpoint-dir", "", "directory of hibernated sandboxes' checkpoints; on a filesystem several nodes share (with the image store), a sandbox hibernated on one node is restored on any of them (`warren sandbox restore`); it must keep owners, device nodes and trusted.* extended attributes (default <state-dir>/checkpoints, this node's own)")
	f.StringVar(&o.nodeName, "node-name", "", "this node's name: Sandbox.node, its name in a cluster (warren gateway), in a shared image store's leases and a shared checkpoint directory; unique among the nodes sharing them (default the hostname)")
	f.StringVar(&o.listen, "listen", "", "also serve on this TCP address, e.g. 127.0.0.1:7070 (needs a token)")
	f.StringVar(&o.tokenFile, "token-file", "", "file holding the bearer token for --listen (default $"+client.EnvToken+")")
	f.BoolVar(&o.insecureNoAuth, "insecure-no-auth", false, "allow --listen without a token")
	f.BoolVar(&o.noUI, "no-ui", false, "do not serve the web dashboard at /ui (docs/UI.md)")
	f.DurationVar(&o.defaultTimeout, "default-timeout", daemon.DefaultTimeout, "sandbox lifetime when a create request gives none")
	f.StringVar(&o.fnDisk, "fn-disk-bytes", "1Gi", "disk quota of a Run job that asks none: everything it writes in /w, /tmp and /var/tmp (each fncall environment gets a filesystem of that size); 0: none, each file bounded by the file size limit only")
	f.StringVar(&o.defaultDisk, "default-disk", "", "disk limit of each sandbox's writable layer when a create request gives none, e.g. 10Gi (default: unlimited, on the state dir's filesystem)")
	f.StringVar(&o.diskReserve, "disk-reserve", "5%", "free space to keep on the state dir's filesystem, a size (2Gi) or a percentage of it (at most 10Gi then); below it (or below 5% of its inodes) creates are refused, below half of it the sandbox whose writable layer takes the most is stopped; 0 turns the guard off")
	f.DurationVar(&o.idleReclaimAfter, "idle-reclaim-after", 5*time.Minute, "reclaim the memory of a running sandbox idle this long (under 1% of a CPU, not stalled on memory): its page cache, and anonymous memory where the node has swap; 0: never")
	f.DurationVar(&o.guardInterval, "guard-interval", daemon.DefaultGuardInterval, "how often every sandbox's containment counters (OOM kills, refused forks, its disk) and the node's free disk are read")
	f.StringVar(&o.trajectoryBytes, "trajectory-max-bytes", "64Mi", "cap of each sandbox's trajectory log (<state-dir>/trajectory/ID.log): past it, calls with a seq are refused (ResourceExhausted) and calls without one run unrecorded")
	f.BoolVar(&o.trajectoryFsync, "trajectory-fsync", false, "fdatasync each recorded outcome before it is returned (~0.2-0.5 ms per exec and file write); by default outcomes are written to the page cache before they are returned, which a daemon crash or restart keeps and a machine crash does not, as it does not keep the running sandbox they describe (checkpoints sync the log)")
	f.BoolVar(&o.noTrajectory, "no-trajectory", false, "record no trajectory log (calls with a seq or session are then Unsupported)")
	f.StringVar(&o.eventLogBytes, "event-log-bytes", "16Mi", "size at which the security event audit file (<state-dir>/events/events.log) is rotated; the node keeps it and one rotated file")
	f.BoolVar(&o.layerDirectIO, "layer-direct-io", true, "mount layer blobs with EROFS's directio option where the kernel and the store's filesystem allow it, so that only the blocks sandboxes read are read (not the store disk's readahead around them)")
	f.IntVar(&o.layerReadAheadKB, "layer-read-ahead-kb", 0, "readahead window of each layer mount in KiB (0: the kernel's default, 128)")
	mkfsDefault := os.Getenv(erofs.MkfsEnv)
	if mkfsDefault == "" {
		mkfsDefault = "auto"
	}
	f.StringVar(&o.mkfsErofs, "mkfs-erofs", mkfsDefault, "the mkfs.erofs (erofs-utils >= 1.8) that converts layers, keeping hardlinks: a path, \"auto\" ("+erofs.MkfsPrefix+"/bin/mkfs.erofs, then $PATH; go-erofs, which stores hardlinks as copies, if neither is usable) or \"off\" (go-erofs); $"+erofs.MkfsEnv+" sets the default")
	f.StringVar(&o.cgroupParent, "cgroup-parent", "warren", "parent cgroup of the sandboxes (give each daemon on a host its own)")
	f.StringSliceVar(&o.dnsUpstreams, "dns-upstream", nil, "nameserver (address or address:port; repeatable or comma-separated) Warren's resolver forwards sandboxes' allowed queries to (default: the nameservers of the node's /etc/resolv.conf)")
	f.StringVar(&o.networkSubnet, "network-subnet", netpolicy.DefaultSubnet.String(), "IPv4 subnet (/16 to /30) sandboxes with a network (open, allowlist) take a /31 of each; give each daemon on a host its own")
	f.BoolVar(&o.cpuAffinity, "cpu-affinity", true, "run a sandbox with a CPU quota on as many of the node's CPUs as its quota (rounded up), the least used ones, and show it that many (nproc, os.cpu_count, /proc/cpuinfo); false leaves every sandbox on all CPUs, seeing all")
	f.BoolVar(&o.seccomp, "seccomp", true, "run every sandbox process under Warren's system-call filter (docs/SECURITY.md); false only to measure its cost or for a workload that needs a refused call")
	f.BoolVar(&o.userns, "userns", true, "create sandboxes in a user namespace (root inside is an unprivileged host id) unless the request says otherwise (create --userns=false) or the image has files owned by ids above 65535; false makes sandboxes without one the default")
	f.StringVar(&o.vmTransport, "vm-transport", microvm.TransportSerial, "how the daemon reaches a VM's guest agent (microvm and fullvm): serial (a virtio-serial port; microVMs can be checkpointed) or vsock (AF_VSOCK through the kernel's /dev/vhost-vsock where the node has it, else a vhost-device-vsock process per VM, scripts/vsock.sh; no checkpoints: docs/MICROVM.md)")
	f.StringVar(&o.vmAccel, "vm-accel", microvm.AccelAuto, "how microVMs and full VMs run: auto (KVM where /dev/kvm is KVM that boots stock guest kernels, not PVM's; else TCG), kvm or tcg (emulation: 10-50x slower, no /dev/kvm needed)")
	f.BoolVar(&o.microVMPmem, "microvm-pmem", false, "map microVMs' image layers as persistent memory the guest mounts with DAX (one copy of a layer on the node for every VM, -M microvm,pcie=on: docs/MICROVM.md) instead of virtio block devices")
	f.BoolVar(&o.microVM, "microvm", true, "offer the microvm backend (QEMU microVMs; docs/MICROVM.md) where the node has QEMU, a guest kernel (scripts/vm.sh) and the guest agent")
	f.BoolVar(&o.fullVM, "fullvm", true, "offer the fullvm backend (QEMU q35 VMs of a Debian disk image with a screen; docs/FULLVM.md) where the node has QEMU and qemu-img; a create fails Unsupported until scripts/fullvm-image.sh has built the image")
	f.StringVar(&o.fullVMImage, "fullvm-image", fullvm.DefaultImageDir, "the fullvm backend's disk image directory (scripts/fullvm-image.sh)")
	f.StringVar(&o.guestAgent, "guest-agent", "", "the microVMs' guest agent (cmd/warren-guest, built static); default: warren-guest beside this binary")
	f.BoolVar(&o.lazyPages, "lazy-pages", true, "restore the memory of resumed and forked sandboxes lazily (userfaultfd, where the kernel has it) unless the request says otherwise; false restores it before Resume and Fork return; docs/HIBERNATE.md")
	f.BoolVar(&o.unprivUserfaultfd, "unprivileged-userfaultfd", true, "set the node's vm.unprivileged_userfaultfd=1 at start, which sandboxes in a user namespace need to restore lazily (their seccomp filter still refuses them userfaultfd; every other unprivileged process on the node may then have one: docs/SECURITY.md); false leaves the kernel's setting as it is, and such sandboxes restore eagerly where it is 0")
	f.StringVar(&o.usernsIDs, "userns-ids", container.DefaultUserNSIDs.String(), "host ids START:COUNT that user-namespace sandboxes take 65,536 each of; give each daemon on a host its own")
	f.StringArrayVar(&o.gpuDevices, "gpu-device", nil, "a GPU device node fncall jobs can be given (repeatable): /dev/nvidia<N> is a GPU, any other (nvidiactl, nvidia-uvm, nvidia-uvm-tools, nvidia-modeset) every GPU job gets (default: the node's /dev/nvidia*)")
	f.StringArrayVar(&o.gpuLibs, "gpu-lib", nil, "a file of the GPU driver bound read-only into GPU jobs (repeatable): libraries at /usr/local/nvidia/lib64, tools at /usr/local/nvidia/bin (default: "+strings.Join(fncall.DefaultGPULibs, ", ")+", found through ldconfig's cache and the usual directories)")
	f.BoolVar(&o.noGPUs, "no-gpus", false, "give jobs no GPU, whatever the node has")
	f.StringVar(&o.logLevel, "log-level", "info", "log level: debug, info, warn, error")
	f.StringVar(&o.logFormat, "log-format", "text", "log format: text or json")
	f.Float64Var(&o.harnessCallRate, "harness-calls-per-second", server.DefaultHarnessCallsPerSecond, "each harness sandbox's call budget through its route (calls over it wait up to a second, then fail exhausted; negative: none)")
	f.IntVar(&o.harnessCallBurst, "harness-call-burst", server.DefaultHarnessCallBurst, "how many calls a harness may make at once above its rate")
	f.DurationVar(&o.stallTimeout, "stall-timeout", server.DefaultStallTimeout, "cut an archive download whose client takes no data, or an upload whose client sends none, for this long (the walk it holds is released)")
	f.StringVar(&o.pprofAddr, "pprof", "", "serve Go's profiling endpoints (/debug/pprof/) on this TCP address, without authentication: use a loopback address such as 127.0.0.1:6060")
	o.cluster.flags(f)
	f.StringVar(&o.nodeTag, "node-tag", "", fmt.Sprintf("in a cluster, the %d characters of [a-z2-7] every id of this node's sandboxes starts with, by which gateways route (default: derived from --node-name)", gateway.TagLen))
	f.StringVar(&o.clusterAPI, "cluster-api", "", "in a cluster, the address gateways reach this node's API at (default: http://<--listen>)")
	f.IntVar(&o.maxSandboxes, "max-sandboxes", 0, "most resident sandboxes (not stopped or hibernated) this node admits, and gateways place on it (0: no cap); a create, fork or restore past it is refused as exhausted")
	f.Float64Var(&o.cpuOvercommit, "cpu-overcommit", 0, "admit sandboxes while the CPU they ask for (cpu_millis) stays within the node's cores times this ratio, e.g. 4 (0: no limit); past it a create, fork or restore is refused as exhausted")
	f.Float64Var(&o.memoryOvercommit, "memory-overcommit", 0, "admit sandboxes while their memory limits (the default counted for those that set none) stay within the node's memory times this ratio, e.g. 1.5 (0: no limit)")
	f.StringVar(&o.e2bAddr, "e2b-addr", "", "also serve the E2B-compatible API (lifecycle REST and envd, docs/E2B.md) on this TCP address, e.g. 127.0.0.1:3000; needs --e2b-api-key-file")
	f.StringVar(&o.e2bKeyFile, "e2b-api-key-file", "", "file of the API keys the E2B API accepts (X-API-Key), one e2b_<hex> per line")
	return c
}

// nodeGPUs are the GPUs the flags name, or the node's own.
func nodeGPUs(o serveOptions) (*fncall.NodeGPUs, error) {
	if o.noGPUs {
		return &fncall.NodeGPUs{}, nil
	}
	c := fncall.GPUConfig{Devices: o.gpuDevices, Libs: o.gpuLibs}
	if len(c.Devices) == 0 {
		found := fncall.DiscoverGPUs()
		c.Devices = found.Devices
		if len(c.Libs) == 0 {
			c.Libs = found.Libs
		}
	}
	n, err := c.Resolve()
	if err != nil {
		return nil, fmt.Errorf("--gpu-device, --gpu-lib: %w", err)
	}
	return n, nil
}

func newLogger(o serveOptions, cmd *cobra.Command) (*slog.Logger, error) {
	var level slog.Level
	if err := level.UnmarshalText([]byte(o.logLevel)); err != nil {
		return nil, usagef("bad --log-level %q", o.logLevel)
	}
	ho := &slog.HandlerOptions{Level: level}
	switch o.logFormat {
	case "text":
		return slog.New(slog.NewTextHandler(cmd.ErrOrStderr(), ho)), nil
	case "json":
		return slog.New(slog.NewJSONHandler(cmd.ErrOrStderr(), ho)), nil
	}
	return nil, usagef("bad --log-format %q: want text or json", o.logFormat)
}

// readToken returns the token from --token-file, else $WARREN_TOKEN.
func readToken(file string) (string, error) {
	if file == "" {
		return strings.TrimSpace(os.Getenv(client.EnvToken)), nil
	}
	b, err := os.ReadFile(file)
	if err != nil {
		return "", fmt.Errorf("read token file: %w", err)
	}
	tok := strings.TrimSpace(string(b))
	if tok == "" {
		return "", fmt.Errorf("token file %s is empty", file)
	}
	return tok, nil
}

func runServe(cmd *cobra.Command, o serveOptions) (err error) {
	// Fds the daemon inherited (a shell's, a supervisor's) would otherwise
	// reach every process it starts: sandbox inits, mkfs.erofs, debootstrap.
	_ = unix.CloseRange(3, ^uint(0), unix.CLOSE_RANGE_CLOEXEC)
	ctx := cmd.Context()
	log, err := newLogger(o, cmd)
	if err != nil {
		return err
	}
	slog.SetDefault(log)
	// Flags first: a bad value is refused before anything starts.
	kvm, kvmWhy, err := microvm.ResolveAccel(o.vmAccel)
	if err != nil {
		return err
	}
	clustered := o.cluster.enabled()
	nodeTag := ""
	if clustered {
		if o.nodeName == "" {
			o.nodeName, _ = os.Hostname() // the daemon's default too
		}
		if nodeTag, err = o.clusterNode(); err != nil {
			return err
		}
	}
	if (o.e2bAddr == "") != (o.e2bKeyFile == "") {
		return usagef("--e2b-addr and --e2b-api-key-file go together")
	}
	if o.layerReadAheadKB < 0 {
		return usagef("--layer-read-ahead-kb must not be negative")
	}
	if o.pprofAddr != "" {
		if _, err := servePprof(ctx, o.pprofAddr, log); err != nil {
			return fmt.Errorf("--pprof: %w", err)
		}
	}
	token := ""
	if o.listen != "" {
		if token, err = readToken(o.tokenFile); err != nil {
			return err
		}
	}
	stateDir, err := filepath.Abs(o.stateDir)
	if err != nil {
		return err
	}
	runDir, err := filepath.Abs(o.runDir)
	if err != nil {
		return err
	}

	met := metrics.New()
	var dash server.UIFactory
	if !o.noUI {
		d, err := ui.New(ui.Options{Logger: log, Role: "node"})
		if err != nil {
			return err
		}
		defer d.Close()
		dash = d.Handler
	}
	srv, err := server.New(server.Config{
		UI:             dash,
		SocketPath:     o.socket,
		ListenAddr:     o.listen,
		Token:          token,
		InsecureNoAuth: o.insecureNoAuth,
		Metrics:        met.Handler(),
		Logger:         log,
		StallTimeout:   o.stallTimeout,

		HarnessCallsPerSecond: o.harnessCallRate,
		HarnessCallBurst:      o.harnessCallBurst,
	})
	if err != nil {
		return err
	}
	// Listen first: it fails if another daemon owns the socket, before we
	// touch its state.
	if err := srv.Listen(); err != nil {
		return err
	}
	defer srv.Close()
	if o.listen != "" && token == "" {
		log.Warn("serving TCP without authentication", "addr", o.listen)
	}

	if err := os.MkdirAll(stateDir, 0o700); err != nil {
		return err
	}
	if err := os.MkdirAll(runDir, 0o700); err != nil {
		return err
	}
	eventLogBytes, err := parseBytes(o.eventLogBytes)
	if err != nil || eventLogBytes < 4096 {
		return usageError{fmt.Errorf("--event-log-bytes %q: want a size of at least 4Ki", o.eventLogBytes)}
	}
	trajectoryBytes, err := parseBytes(o.trajectoryBytes)
	if err != nil || trajectoryBytes < 4096 {
		return usageError{fmt.Errorf("--trajectory-max-bytes %q: want a size of at least 4Ki", o.trajectoryBytes)}
	}
	if o.cpuOvercommit < 0 || o.memoryOvercommit < 0 || o.maxSandboxes < 0 {
		return usageError{errors.New("--cpu-overcommit, --memory-overcommit and --max-sandboxes must not be negative")}
	}
	diskReserve, err := parseReserve(o.diskReserve, stateDir)
	if err != nil {
		return usageError{fmt.Errorf("--disk-reserve: %w", err)}
	}
	var defaultDisk int64
	if o.defaultDisk != "" {
		if defaultDisk, err = parseBytes(o.defaultDisk); err != nil {
			return usageError{err}
		}
	}
	fnDisk, err := parseBytes(o.fnDisk)
	if err != nil {
		return usageError{fmt.Errorf("--fn-disk-bytes: %w", err)}
	}
	mkfs, why, err := erofs.SelectMkfs(o.mkfsErofs)
	if err != nil {
		return fmt.Errorf("--mkfs-erofs: %w", err)
	}
	log.Info("memory reclaim of idle sandboxes", "after", o.idleReclaimAfter, "damon", daemon.DAMONState())
	if mkfs != nil {
		log.Info("layers are converted with mkfs.erofs", "version", mkfs.Version, "path", mkfs.Path)
	} else {
		log.Info("layers are converted with go-erofs (hardlinks stored as copies)", "why", why.Error())
	}
	imageStore := filepath.Join(stateDir, "images")
	if o.imageStore != "" {
		if imageStore, err = filepath.Abs(o.imageStore); err != nil {
			return err
		}
	}
	checkpointDir := ""
	if o.checkpointDir != "" {
		if checkpointDir, err = filepath.Abs(o.checkpointDir); err != nil {
			return err
		}
	}
	images, err := image.OpenStore(image.Options{
		Root:             imageStore,
		MountDir:         filepath.Join(runDir, "layers"),
		WorkDir:          filepath.Join(stateDir, "tmp"),
		BufferedIO:       !o.layerDirectIO,
		LayerReadAheadKB: o.layerReadAheadKB,
		Mkfs:             mkfs,
		NodeID:           o.nodeName,
		Log:              log,
	})
	if err != nil {
		return fmt.Errorf("open image store: %w", err)
	}
	met.RegisterLayers(func(ctx context.Context) ([]metrics.LayerSample, error) {
		st, err := images.MountedStats(ctx)
		out := make([]metrics.LayerSample, len(st))
		for i, x := range st {
			out[i] = metrics.LayerSample{Digest: x.Digest, Size: x.Size, Resident: x.Resident, BlobResident: x.BlobResident,
				FilesResident: x.FilesResident, Refs: x.Refs, DirectIO: x.DirectIO}
		}
		return out, err
	}, 0)
	// Deferred before the daemon's Close, so it runs after it: sandboxes
	// keep the layers they use mounted; unused ones are unmounted.
	defer func() {
		if cerr := images.Close(); cerr != nil {
			log.Warn("closing image store", "err", cerr)
		}
	}()
	subnet, err := netip.ParsePrefix(o.networkSubnet)
	if err != nil {
		return fmt.Errorf("--network-subnet: %w", err)
	}
	if o.userns {
		if err := container.UserNSSupported(); err != nil {
			log.Warn("sandboxes run without user namespaces by default", "reason", err)
			o.userns = false
		}
	}
	idRange, err := container.ParseIDRange(o.usernsIDs)
	if err != nil {
		return fmt.Errorf("--userns-ids: %w", err)
	}
	gpus, err := nodeGPUs(o)
	if err != nil {
		return err
	}
	if n := len(gpus.GPUs); n > 0 {
		log.Info("GPUs for fncall jobs", "gpus", n, "control_nodes", len(gpus.Control), "driver_files", len(gpus.Mounts))
	}
	ctr, err := container.New(container.Options{UserNSIDs: idRange, StateDir: stateDir, RunDir: runDir, CgroupParent: o.cgroupParent, Warn: log.Warn, NoCPUAffinity: !o.cpuAffinity, NoSeccomp: !o.seccomp, ObservePhase: met.ObserveCreatePhase,
		NetworkSubnet: subnet, Devices: gpus.All()})
	if err != nil {
		return fmt.Errorf("container backend: %w", err)
	}
	// Seccomp denials logged by the kernel (filters with
	// SECCOMP_FILTER_FLAG_LOG) become events where the audit multicast
	// group can be joined.
	var sources []events.Source
	if src, err := kaudit.Open(ctr); err != nil {
		log.Info("no seccomp events: the kernel's audit records cannot be read", "err", err)
	} else {
		sources = append(sources, src)
	}
	// Sandboxes with a network resolve through the daemon's resolver at
	// their gateway; without one (no upstream) their DNS is refused as
	// any other traffic to the node.
	if res, err := resolver.New(resolver.Options{Node: ctr.Network(), Upstreams: o.dnsUpstreams, Observe: met.ObserveDNS, Logger: log}); err != nil {
		if len(o.dnsUpstreams) > 0 {
			return fmt.Errorf("--dns-upstream: %w", err)
		}
		log.Warn("no DNS for sandboxes: the resolver cannot start", "err", err)
	} else {
		met.InitDNSResults(resolver.Results...)
		if err := ctr.Network().SetResolver(res.Port()); err != nil {
			_ = res.Close()
			return fmt.Errorf("redirect sandboxes' DNS to the resolver: %w", err)
		}
		log.Info("resolver for sandboxes started", "port", res.Port(), "upstreams", strings.Join(res.Upstreams(), ","))
		sources = append(sources, res)
	}
	// Packets the network policy refused, logged by its rules to the
	// backend's NFLOG group, become policy_drop events.
	if src, err := ctr.PolicyDrops(); err != nil {
		log.Info("no policy_drop events: the refused packets' log cannot be read", "err", err)
	} else {
		sources = append(sources, src)
	}
	// Run's jobs: pools of container sandboxes per image, made on the
	// first call of each image (internal/fncall).
	fn, err := fncall.New(fncall.Options{Backend: ctr, DiskBytes: fnDisk, GPUs: gpus, Logger: log})
	if err != nil {
		return fmt.Errorf("fncall backend: %w", err)
	}
	// The same pools serve Create with backend "fncall": sandboxes taken
	// ready-made from a pool.
	fnb, err := fn.NewBackend(filepath.Join(runDir, "fncall"), func(ctx context.Context, ls []backend.Layer) (func(), error) {
		digests := make([]string, 0, len(ls))
		for i := len(ls) - 1; i >= 0; i-- { // bottom first
			if ls[i].Digest == "" {
				return func() {}, nil // a directory layer: nothing to hold
			}
			digests = append(digests, ls[i].Digest)
		}
		_, release, err := images.LayerRefs(ctx, image.Image{Name: "fncall pool", Layers: digests}, true)
		return release, err
	})
	if err != nil {
		return fmt.Errorf("fncall backend: %w", err)
	}
	backends := map[string]backend.Backend{ctr.Name(): ctr, fnb.Name(): fnb}
	uffdAsked := cmd.Flags().Changed("unprivileged-userfaultfd")
	if o.unprivUserfaultfd && !o.seccomp && !uffdAsked {
		// The filter is what keeps the setting from sandboxes.
		log.Info("left vm.unprivileged_userfaultfd as it is: without the seccomp filter (--seccomp=false) sandboxes could make userfaultfds themselves")
	} else if o.unprivUserfaultfd {
		was, err := container.AllowUnprivilegedUserfaultfd()
		switch {
		case err != nil && uffdAsked:
			return err
		case err != nil:
			// The default, on a node that will not have it (a read-only
			// /proc/sys in a container, say): restores are eager, and
			// the message below and every Resume and Fork say why.
			log.Warn("could not allow unprivileged userfaultfds", "err", err)
		case was != "":
			log.Info("set vm.unprivileged_userfaultfd=1 (was " + was + "): sandboxes in a user namespace restore lazily; their seccomp filter still refuses them userfaultfd (--unprivileged-userfaultfd=false keeps the kernel's setting)")
		}
	}
	if err := container.UserNSLazyRestore(); err != nil && o.lazyPages {
		log.Info("sandboxes in a user namespace restore their memory eagerly (slower resumes and forks; docs/DEPLOY.md)", "why", err)
	}
	if o.microVM || o.fullVM {
		log.Info("VMs run under "+map[bool]string{true: "KVM", false: "TCG"}[kvm], "why", kvmWhy)
	}
	if o.microVM {
		agent := o.guestAgent
		if agent == "" {
			agent = microvm.DefaultGuestAgent()
		}
		// VMs share the container backend's sandbox networking: one
		// subnet, table and resolver per daemon.
		vb, err := microvm.New(microvm.Options{StateDir: filepath.Join(stateDir, "microvm"), GuestAgent: agent, Network: ctr.Network(), PMEM: o.microVMPmem, CgroupParent: o.cgroupParent, Transport: o.vmTransport, KVM: kvm})
		if err != nil {
			log.Info("no microvm backend", "err", err)
		} else {
			backends[vb.Name()] = vb
		}
	}
	if o.fullVM {
		// Full VMs too: their taps beside the microVMs' (each backend
		// sweeps its own: netpolicy.Node.SweepTaps).
		fb, err := fullvm.New(fullvm.Options{StateDir: filepath.Join(stateDir, "fullvm"), ImageDir: o.fullVMImage, Network: ctr.Network(), CgroupParent: o.cgroupParent, Transport: o.vmTransport, KVM: kvm})
		if err != nil {
			log.Info("no fullvm backend", "err", err)
		} else {
			backends[fb.Name()] = fb
		}
	}
	mgr, err := daemon.New(ctx, daemon.Config{
		StateDir:           stateDir,
		NodeTag:            nodeTag,
		MaxSandboxes:       o.maxSandboxes,
		CPUOvercommit:      o.cpuOvercommit,
		MemoryOvercommit:   o.memoryOvercommit,
		Backends:           backends,
		Images:             images,
		Metrics:            met,
		DefaultTimeout:     o.defaultTimeout,
		DefaultDiskBytes:   defaultDisk,
		EventFileBytes:     eventLogBytes,
		TrajectoryMaxBytes: trajectoryBytes,
		NoTrajectory:       o.noTrajectory,
		TrajectoryNoSync:   !o.trajectoryFsync,
		DiskReserveBytes:   diskReserve,
		EventSources:       sources,
		GuardInterval:      o.guardInterval,
		IdleReclaimAfter:   o.idleReclaimAfter,
		UserNSDefault:      o.userns,
		LazyPages:          o.lazyPages,
		FnCall:             fn,
		Router:             srv,
		CheckpointDir:      checkpointDir,
		NodeName:           o.nodeName,
		Logger:             log,
	})
	if err != nil {
		_ = fn.Close()
		return fmt.Errorf("start daemon: %w", err)
	}
	defer func() {
		if cerr := mgr.Close(); cerr != nil {
			log.Error("closing daemon", "err", cerr)
			err = errors.Join(err, cerr)
		}
	}()
	if o.e2bAddr != "" {
		stop, err := serveE2B(o.e2bAddr, o.e2bKeyFile, mgr, log)
		if err != nil {
			return err
		}
		// Deferred after the daemon's Close, so it runs first: no E2B
		// call reaches a closing daemon.
		defer stop()
	}
	log.Info("warren daemon started", "version", daemon.Version, "state_dir", stateDir, "image_store", imageStore, "socket", o.socket)
	if clustered {
		// Joined once the API serves: a gateway that sees the node
		// pulls its report at once.
		pool, err := o.cluster.join(o.nodeName, membership.Meta{Role: membership.RoleNode, API: o.apiAddr(), Tag: nodeTag}, nil, log)
		if err != nil {
			return err
		}
		defer func() {
			if cerr := pool.Close(); cerr != nil {
				log.Warn("leaving the cluster", "err", cerr)
			}
		}()
	}
	err = srv.Serve(ctx, mgr)
	log.Info("warren daemon stopped")
	return err
}

// maxPercentReserve caps a reserve given as a percentage: 5% of a 4 TB
// disk would refuse creates with 200 GB free.
const maxPercentReserve = 10 << 30

// parseReserve reads --disk-reserve: a size, or a percentage of the
// filesystem holding dir (capped at maxPercentReserve).
func parseReserve(s, dir string) (int64, error) {
	pct, ok := strings.CutSuffix(strings.TrimSpace(s), "%")
	if !ok {
		return parseBytes(s)
	}
	p, err := strconv.ParseFloat(pct, 64)
	if err != nil || p < 0 || p >= 100 {
		return 0, fmt.Errorf("invalid percentage %q", s)
	}
	var st unix.Statfs_t
	if err := unix.Statfs(dir, &st); err != nil {
		return 0, fmt.Errorf("statfs %s: %w", dir, err)
	}
	return min(int64(float64(st.Blocks)*float64(st.Bsize)*p/100), maxPercentReserve), nil
}

// serveE2B starts the E2B-compatible front door (internal/e2b) over mgr
// (a node's daemon, or a gateway) and returns its stop.
func serveE2B(addr, keyFile string, mgr e2b.Manager, log *slog.Logger) (func(), error) {
	keys, err := e2b.ReadKeys(keyFile)
	if err != nil {
		return nil, fmt.Errorf("--e2b-api-key-file: %w", err)
	}
	es, err := e2b.New(e2b.Config{Addr: addr, Keys: keys, Manager: mgr, Logger: log})
	if err != nil {
		return nil, err
	}
	if err := es.Listen(); err != nil {
		return nil, fmt.Errorf("--e2b-addr: %w", err)
	}
	done := make(chan struct{})
	go func() {
		defer close(done)
		if err := es.Serve(); err != nil {
			log.Error("E2B API stopped", "err", err)
		}
	}()
	log.Info("E2B API listening", "addr", es.Addr().String(), "keys", len(keys))
	return func() {
		if err := es.Close(); err != nil {
			log.Warn("closing the E2B API", "err", err)
		}
		<-done
	}, nil
}
