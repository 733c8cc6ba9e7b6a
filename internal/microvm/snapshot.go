package microvm

import (
	"context"
	"crypto/rand"
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"time"

	"github.com/warrenrl/warren/internal/atomicfile"
	"github.com/warrenrl/warren/internal/backend"
	"github.com/warrenrl/warren/internal/cleanup"
	"github.com/warrenrl/warren/internal/errdefs"
	"github.com/warrenrl/warren/internal/guest"
	"github.com/warrenrl/warren/internal/qmp"
)

// Hibernate, restore and fork (backend.Checkpointer, Spec.Restore).
//
// A checkpoint is QEMU's own migration stream of the stopped VM, written
// to a file in the checkpoint directory (stateFile: the guest's memory,
// its upper layer included unless on a disk, and every device's state), and what a new
// QEMU needs to take it in (configFile: memory, vCPUs, the layers' order,
// the ports hot-plugged by adoptions, the sandbox's settings). A restore
// starts QEMU with the same machine and devices, on this VM's own
// directory (sockets and console are not part of the migrated state, so a
// restore elsewhere and each fork of one checkpoint get their own), has it
// load the file (-incoming, stopped: -S), runs it on, and reaches the
// agent on a port hot-plugged for it as an adoption does (attach.go): the
// old ports have no host in the new QEMU, so the guest sees them closed
// and the agent's sessions on them end, while its background processes
// run on. The agent is then told it was restored: it reseeds the guest's
// random number generator (two forks of one checkpoint would otherwise
// draw the same numbers) and sets its clock to the node's (the guest's
// clock stood still while the VM was on disk).
//
// What lives outside the guest's RAM follows: a disk limit's image is
// copied into the checkpoint and out again for each restore (disk.go:
// copyDisk); layers on pmem are the store's files, mapped again and left
// out of the stream (pmem.go: ignoreShared); a network is a new tap of
// the restore's policy, whose /31 the agent is told ("network").

const (
	stateFile  = "vm.state" // the migration stream
	configFile = "vm.json"  // savedVM
	diskFile   = "disk.img" // the writable disk's copy, if the VM has one
	// savedVersion is configFile's format.
	savedVersion = 1
)

// savedVM is what restoring a checkpoint needs beside the migration
// stream.
type savedVM struct {
	Version  int  `json:"version"`
	MemoryMB int  `json:"memory_mb"`
	CPUs     int  `json:"cpus"`
	KVM      bool `json:"kvm"`
	// Layers are the layers' digests, bottom first (empty for a VM
	// adopted from a daemon that did not keep them); their number is
	// the number of disks.
	Layers     []string `json:"layers,omitempty"`
	LayerCount int      `json:"layer_count"`
	// The guest's kernel command line's settings (the restored guest
	// keeps those it booted with; these make the same QEMU).
	Hostname      string `json:"hostname,omitempty"`
	SandboxMemory int64  `json:"sandbox_memory,omitempty"`
	SandboxPids   int64  `json:"sandbox_pids,omitempty"`
	// Ports are the agent ports adoptions hot-plugged: the new QEMU has
	// them too (virtio-serial's state names its ports).
	Ports []savedPort `json:"ports,omitempty"`
	// The sandbox's defaults (vmState's).
	Env     []string       `json:"env,omitempty"`
	Cwd     string         `json:"cwd,omitempty"`
	Rlimits []guest.Rlimit `json:"rlimits,omitempty"`
	Kernel  string         `json:"kernel"` // the guest kernel's release, which the memory holds
	// The machine's devices beyond the layers (the stream names them):
	// layers on pmem (Config.PMEM: mapped from the same files again,
	// not in the stream: pmem.go), no balloon (Config.NoBalloon).
	PMEM      bool `json:"pmem,omitempty"`
	NoBalloon bool `json:"no_balloon,omitempty"`
	// Disk says the VM's writable layer is on a disk of its own, whose
	// copy is diskFile.
	Disk bool `json:"disk,omitempty"`
	// Net says the VM has a network device: a restore gives it a tap
	// (of the restore's policy) and the guest its new address.
	Net bool `json:"net,omitempty"`
}

// savedPort is a hot-plugged agent port: device portN on chardev agentN,
// named PortName.N, at virtio-serial port number Nr.
type savedPort struct {
	N  int `json:"n"`
	Nr int `json:"nr"`
}

var _ backend.Checkpointer = (*sandbox)(nil)

// Checkpoint saves the VM into dir and ends its QEMU. A VM that cannot be
// saved runs on, as it was.
func (s *sandbox) Checkpoint(ctx context.Context, dir string) (err error) {
	v := s.vm
	if v.cfg.Vsock != nil {
		// vsock.go: QEMU 7.2 does not migrate a vhost-user-vsock device
		// (and a paused one is frozen: its QMP does not answer).
		return errdefs.Unsupportedf("microvm: a VM whose agent is on vsock cannot be checkpointed (QEMU does not save a vhost-user vsock device; the daemon's --vm-transport serial boots VMs that can be)")
	}
	c, err := qmp.Dial(ctx, filepath.Join(v.cfg.Dir, qmpSocket))
	if err != nil {
		return v.streamErr(ctx, err, "connect to QEMU's QMP socket")
	}
	defer c.Close()
	if v.cfg.Args != nil {
		// Another machine (internal/fullvm): its disk is writable and
		// its devices are not qemuArgs', which a restore remakes.
		return errdefs.Unsupportedf("microvm: a VM of another machine (fullvm) cannot be checkpointed yet")
	}
	if err := refuseWritableDisks(ctx, c, s.disk); err != nil {
		return err
	}
	// Ports of adoptions whose host is gone go first, so that restores
	// do not add up ports (a restore adds one: restoreVM).
	unplugStale(ctx, c, v.cfg.Dir)
	ports, err := hotpluggedPorts(ctx, c)
	if err != nil {
		return err
	}
	saved := savedVM{Version: savedVersion, MemoryMB: v.cfg.MemoryMB, CPUs: v.cfg.CPUs, KVM: v.cfg.KVM,
		Layers: s.digests, LayerCount: len(v.cfg.Layers), Hostname: v.cfg.Hostname,
		SandboxMemory: v.cfg.SandboxMemory, SandboxPids: v.cfg.SandboxPids, Ports: ports,
		Env: s.env, Cwd: s.cwd, Rlimits: s.rlimits, Kernel: v.cfg.Kernel.Release,
		PMEM: v.cfg.PMEM, NoBalloon: v.cfg.NoBalloon, Disk: s.disk, Net: s.att != nil}
	if saved.MemoryMB == 0 || saved.CPUs == 0 || saved.LayerCount == 0 {
		// An adopted VM's Config is only its directory: read back from
		// its QEMU's command line.
		if err := savedFromCmdline(v.Pid(), &saved); err != nil {
			return err
		}
	}
	enc, _ := json.Marshal(saved)
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return errdefs.Wrap(errdefs.Internal, err, "microvm: checkpoint directory")
	}
	if err := atomicfile.Write(filepath.Join(dir, configFile), ".vm-", enc, 0o600); err != nil {
		return errdefs.Wrap(errdefs.Internal, err, "microvm: write the VM's settings")
	}
	out := filepath.Join(dir, stateFile)
	defer func() {
		if err != nil {
			_ = os.Remove(out)
			_ = os.Remove(filepath.Join(dir, configFile))
			_ = os.Remove(filepath.Join(dir, diskFile))
		}
	}()
	st, err := c.QueryStatus(ctx)
	if err != nil {
		return v.streamErr(ctx, err, "QMP query-status")
	}
	if st.Running {
		if err := c.Run(ctx, "stop", nil, nil); err != nil {
			return errdefs.Wrap(errdefs.Internal, err, "microvm: stop the VM to save it")
		}
		defer func() {
			if err != nil {
				// It runs on, as it was: on a context of its own (the
				// caller's may be what ended), and a connection of its
				// own (QEMU serves one client at a time, and this one
				// may be what broke).
				c.Close()
				rctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 10*time.Second)
				defer cancel()
				if cerr := v.qmp(rctx, "cont", nil); cerr != nil {
					err = fmt.Errorf("%w (and the VM could not be run on: %v)", err, cerr)
				}
			}
		}()
	}
	if v.cfg.PMEM {
		if err := ignoreShared(ctx, c); err != nil {
			return err
		}
	}
	if err := migrateTo(ctx, c, out); err != nil {
		return err
	}
	if s.disk {
		// The disk is quiet: the VM is stopped and the migration's end
		// flushed and released QEMU's images. Should the copy fail, the
		// "cont" above takes them back and the VM runs on.
		if _, err := copyDisk(diskImage(v.cfg.Dir), filepath.Join(dir, diskFile)); err != nil {
			return err
		}
	}
	// Saved: the VM ends here (Exited is done once QEMU is gone); the
	// caller's Destroy removes the rest.
	v.Close()
	return nil
}

// migrateTo writes the stopped VM's migration stream to the file out:
// QEMU 7.2 has no file: migration, so it gets the file's descriptor
// (getfd) and migrates to it, with no bandwidth cap (QEMU's default caps
// a migration at 128 MiB/s, for live ones over a network).
func migrateTo(ctx context.Context, c *qmp.Client, out string) error {
	f, err := os.OpenFile(out, os.O_WRONLY|os.O_CREATE|os.O_TRUNC, 0o600)
	if err != nil {
		return errdefs.Wrap(errdefs.Internal, err, "microvm: create the state file")
	}
	defer f.Close()
	if err := c.Run(ctx, "migrate-set-parameters", map[string]any{"max-bandwidth": int64(1) << 40}, nil); err != nil {
		return errdefs.Wrap(errdefs.Internal, err, "microvm: QMP migrate-set-parameters")
	}
	if err := c.RunWithFile(ctx, "getfd", map[string]any{"fdname": "checkpoint"}, nil, f); err != nil {
		return errdefs.Wrap(errdefs.Internal, err, "microvm: pass the state file to QEMU")
	}
	if err := c.Run(ctx, "migrate", map[string]any{"uri": "fd:checkpoint"}, nil); err != nil {
		_ = c.Run(context.WithoutCancel(ctx), "closefd", map[string]any{"fdname": "checkpoint"}, nil)
		return errdefs.Wrap(errdefs.Internal, err, "microvm: QMP migrate")
	}
	for {
		var m struct {
			Status string `json:"status"`
			Error  string `json:"error-desc"`
		}
		if err := c.Run(ctx, "query-migrate", nil, &m); err != nil {
			if ctx.Err() != nil {
				cctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 5*time.Second)
				_ = c.Run(cctx, "migrate_cancel", nil, nil)
				cancel()
			}
			return errdefs.Wrap(errdefs.Unavailable, err, "microvm: QMP query-migrate")
		}
		switch m.Status {
		case "completed":
			return nil
		case "failed", "cancelled":
			return errdefs.Internalf("microvm: saving the VM %s: %s", m.Status, m.Error)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// refuseWritableDisks: a writable disk is state outside the migration
// stream. The VM's own (a disk limit's upper, hasDisk) is copied with the
// checkpoint; any other (none is made by Warren) would be lost.
func refuseWritableDisks(ctx context.Context, c *qmp.Client, hasDisk bool) error {
	var blocks []struct {
		Device   string `json:"device"`
		Inserted *struct {
			RO bool `json:"ro"`
		} `json:"inserted"`
	}
	if err := c.Run(ctx, "query-block", nil, &blocks); err != nil {
		return errdefs.Wrap(errdefs.Internal, err, "microvm: QMP query-block")
	}
	for _, b := range blocks {
		if b.Inserted != nil && !b.Inserted.RO && !(hasDisk && b.Device == guest.DiskSerial) {
			return errdefs.Unsupportedf("microvm: the VM has a writable disk (%s) other than its writable layer's, which checkpoints do not copy: it cannot be hibernated or forked", b.Device)
		}
	}
	return nil
}

// hotpluggedPorts lists the agent ports adoptions added (portN devices).
func hotpluggedPorts(ctx context.Context, c *qmp.Client) ([]savedPort, error) {
	var devs []struct {
		Name string `json:"name"`
	}
	if err := c.Run(ctx, "qom-list", map[string]any{"path": "/machine/peripheral"}, &devs); err != nil {
		return nil, errdefs.Wrap(errdefs.Internal, err, "microvm: QMP qom-list")
	}
	var out []savedPort
	for _, d := range devs {
		var n int
		if _, err := fmt.Sscanf(d.Name, "port%d", &n); err != nil || d.Name != fmt.Sprintf("port%d", n) {
			continue
		}
		var nr int
		if err := c.Run(ctx, "qom-get", map[string]any{"path": "/machine/peripheral/" + d.Name, "property": "nr"}, &nr); err != nil {
			return nil, errdefs.Wrap(errdefs.Internal, err, "microvm: QMP qom-get "+d.Name+".nr")
		}
		out = append(out, savedPort{N: n, Nr: nr})
	}
	return out, nil
}

// savedFromCmdline fills what an adopted VM's Config lacks from its
// QEMU's command line: memory, vCPUs, the layers' disks, the settings on
// the kernel command line.
func savedFromCmdline(pid int, sv *savedVM) error {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/cmdline", pid))
	if err != nil {
		return errdefs.Wrap(errdefs.Unavailable, err, "microvm: the VM's command line")
	}
	args := strings.Split(strings.TrimRight(string(b), "\x00"), "\x00")
	sv.LayerCount = 0
	sv.NoBalloon = true
	for i := 0; i+1 < len(args); i++ {
		a, val := args[i], args[i+1]
		switch a {
		case "-M":
			if !strings.HasPrefix(val, "microvm") {
				return errdefs.Unsupportedf("microvm: a VM of another machine (%s: fullvm) cannot be checkpointed yet", val)
			}
			if strings.Contains(val, "pcie=on") {
				// Layers on pmem: the memory layout is not read back.
				return errdefs.Unsupportedf("microvm: a VM with its layers on pmem, adopted from an earlier daemon, cannot be checkpointed")
			}
		case "-device":
			if strings.HasPrefix(val, "virtio-balloon-device") {
				sv.NoBalloon = false
			}
		case "-m":
			fmt.Sscanf(val, "%dM", &sv.MemoryMB)
		case "-smp":
			fmt.Sscanf(val, "%d", &sv.CPUs)
		case "-accel":
			sv.KVM = val == "kvm"
		case "-drive":
			if strings.Contains(val, ",id=layer") {
				sv.LayerCount++
			}
		case "-append":
			for _, f := range strings.Fields(val) {
				k, x, _ := strings.Cut(f, "=")
				switch k {
				case "warren.hostname":
					sv.Hostname = x
				case "warren.memory":
					fmt.Sscanf(x, "%d", &sv.SandboxMemory)
				case "warren.pids":
					fmt.Sscanf(x, "%d", &sv.SandboxPids)
				}
			}
		}
	}
	if sv.MemoryMB == 0 || sv.CPUs == 0 || sv.LayerCount == 0 {
		return errdefs.Internalf("microvm: the VM's command line does not say its memory, vCPUs and layers")
	}
	return nil
}

// readSaved reads a checkpoint's settings.
func readSaved(dir string) (savedVM, error) {
	var sv savedVM
	b, err := os.ReadFile(filepath.Join(dir, configFile))
	if errors.Is(err, fs.ErrNotExist) {
		return sv, errdefs.Invalidf("microvm: %s holds no VM checkpoint (no %s)", dir, configFile)
	}
	if err == nil {
		err = json.Unmarshal(b, &sv)
	}
	if err != nil {
		return sv, errdefs.Wrap(errdefs.Internal, err, "microvm: read the checkpoint's settings")
	}
	if sv.Version != savedVersion {
		return sv, errdefs.Unsupportedf("microvm: checkpoint format %d, this node reads %d", sv.Version, savedVersion)
	}
	if _, err := os.Stat(filepath.Join(dir, stateFile)); err != nil {
		return sv, errdefs.Wrap(errdefs.Internal, err, "microvm: the checkpoint's state file")
	}
	if _, err := os.Stat(filepath.Join(dir, diskFile)); sv.Disk && err != nil {
		return sv, errdefs.Wrap(errdefs.Internal, err, "microvm: the checkpoint's disk image")
	}
	return sv, nil
}

// restore makes sandbox spec.ID from the checkpoint in spec.Restore,
// whose layers are layers (bottom first, this node's files): the
// checkpointed sandbox itself, or a fork of it. The checkpoint is only
// read.
func (b *Backend) restore(ctx context.Context, spec backend.Spec, layers []string) (backend.Sandbox, error) {
	sv, err := readSaved(spec.Restore)
	if err != nil {
		return nil, err
	}
	var digests []string
	for i := len(spec.Layers) - 1; i >= 0; i-- {
		digests = append(digests, spec.Layers[i].Digest)
	}
	switch {
	case sv.LayerCount != len(layers):
		return nil, errdefs.Invalidf("microvm: the checkpoint has %d layers, the restore %d", sv.LayerCount, len(layers))
	case len(sv.Layers) > 0 && strings.Join(sv.Layers, " ") != strings.Join(digests, " "):
		return nil, errdefs.Invalidf("microvm: the checkpoint's layers %v are not the restore's %v", sv.Layers, digests)
	case sv.KVM != b.opts.KVM:
		return nil, errdefs.Unsupportedf("microvm: the checkpoint was made under %s, this node runs VMs under %s", accelName(sv.KVM), accelName(b.opts.KVM))
	}
	if err := layersPresent(spec, layers); err != nil {
		return nil, err
	}
	switch {
	case sv.Net && spec.Network.IsNone():
		return nil, errdefs.Invalidf("microvm: the checkpoint's VM has a network device, the restore's network policy is none")
	case !sv.Net && !spec.Network.IsNone():
		return nil, errdefs.Unsupportedf("microvm: the checkpoint's VM has no network device, which a restore cannot add (network policy %s)", spec.Network)
	case sv.Net && b.opts.Network == nil:
		return nil, errdefs.Unsupportedf("microvm: the checkpoint's VM has a network, and this backend no sandbox networking")
	}
	// The guest's memory holds the kernel it booted (sv.Kernel): QEMU
	// loads this node's before the stream overwrites it, so any kernel
	// does here, as does the initramfs (built for this node's agent).
	if err := os.Mkdir(b.vmDir(spec.ID), 0o700); err != nil {
		if os.IsExist(err) {
			return nil, errdefs.AlreadyExistsf("microvm: sandbox %s exists", spec.ID)
		}
		return nil, errdefs.Wrap(errdefs.Internal, err, "microvm: VM directory")
	}
	var cu cleanup.Cleanup
	defer func() { _ = cu.Clean() }()
	cu.Add(func() error { return os.RemoveAll(b.vmDir(spec.ID)) })
	cfg := Config{QEMU: b.opts.QEMU, Kernel: b.kernel, GuestAgent: b.opts.GuestAgent,
		Dir: b.vmDir(spec.ID), Layers: layers, MemoryMB: sv.MemoryMB, CPUs: sv.CPUs, KVM: sv.KVM,
		Hostname: sv.Hostname, CacheDir: b.opts.StateDir, SandboxMemory: sv.SandboxMemory, SandboxPids: sv.SandboxPids, Rlimits: sv.Rlimits,
		PMEM: sv.PMEM, NoBalloon: sv.NoBalloon}
	if sv.Disk {
		// Each restore its own copy: the checkpoint stays as it was for
		// the next (a fork's).
		cfg.Disk = diskImage(cfg.Dir)
		if _, err := copyDisk(filepath.Join(spec.Restore, diskFile), cfg.Disk); err != nil {
			return nil, err
		}
	}
	st := vmState{Env: sv.Env, Cwd: sv.Cwd, Rlimits: sv.Rlimits, Disk: sv.Disk}
	if sv.Net {
		// A tap of its own, on the /31 the node gives it now (a fork's
		// is another than its source's): the guest is told (restoreVM).
		a, tap, err := b.opts.Network.AttachTap(Name, spec.ID, sv.Hostname, spec.Network)
		if err != nil {
			return nil, err
		}
		defer tap.Close() // QEMU holds it once started
		cu.Add(func() error { return b.opts.Network.Detach(spec.ID, a) })
		gw, addr := b.opts.Network.Addrs(a.Index)
		cfg.Net = &Net{Tap: tap, Addr: addr, Gateway: gw, Resolv: len(spec.Etc) > 0}
		st.Net = &a
	}
	// A restored QEMU gets a cgroup of its own as a booted one does, for
	// the restore's CPU quota and class (the memory is the checkpoint's).
	if cfg.Cgroup, err = b.hostGroup(spec, sv.MemoryMB, sv.CPUs); err != nil {
		return nil, err
	}
	cu.Add(func() error { _ = cfg.Cgroup.Delete(); return nil }) // gone already if QEMU ran
	v, err := restoreVM(ctx, cfg, spec.Restore, sv.Ports)
	if err != nil {
		return nil, err
	}
	if err := isolate(v.Pid(), spec.QoS); err != nil {
		v.Close()
		return nil, err
	}
	cu.Release()
	st.Group, st.CPUMillis, st.MemoryMB = true, spec.CPUMillis, sv.MemoryMB
	sb := b.newSandbox(spec.ID, v, st)
	sb.digests = sv.Layers
	if spec.LazyPages {
		sb.eagerWhy = "a VM's memory comes back whole from its checkpoint's migration stream"
	}
	return sb, nil
}

// layersPresent: the restored guest reads its layers where the checkpoint
// did not keep them (its disks; on pmem, its memory maps them): a layer
// gone from the store is named, NotFound.
func layersPresent(spec backend.Spec, layers []string) error {
	for i, l := range layers {
		if _, err := os.Stat(l); err != nil {
			d := spec.Layers[len(spec.Layers)-1-i].Digest
			return errdefs.Wrap(errdefs.NotFound, err, fmt.Sprintf("microvm: the checkpoint's layer %s is gone from the store, and the restored VM reads it", d))
		}
	}
	return nil
}

func accelName(kvm bool) string {
	if kvm {
		return "KVM"
	}
	return "TCG"
}

// restoreVM starts QEMU on cfg with the checkpoint in dir as its incoming
// migration, runs it once loaded, and reaches its agent on a port of its
// own.
func restoreVM(ctx context.Context, cfg Config, dir string, ports []savedPort) (_ *VM, err error) {
	t0 := time.Now()
	initrd, err := buildInitramfs(cfg)
	if err != nil {
		return nil, err
	}
	args, err := qemuArgs(cfg, initrd, filepath.Join(cfg.Dir, "agent.sock"), filepath.Join(cfg.Dir, qmpSocket))
	if err != nil {
		return nil, err
	}
	for _, p := range ports {
		args = append(args,
			"-chardev", fmt.Sprintf("socket,id=agent%d,path=%s,server=on,wait=off", p.N, filepath.Join(cfg.Dir, fmt.Sprintf("a%d.sock", p.N))),
			"-device", fmt.Sprintf("virtserialport,id=port%d,chardev=agent%d,name=%s.%d,nr=%d", p.N, p.N, guest.PortName, p.N, p.Nr))
	}
	state, err := os.Open(filepath.Join(dir, stateFile))
	if err != nil {
		return nil, errdefs.Wrap(errdefs.Internal, err, "microvm: open the checkpoint's state file")
	}
	defer state.Close()
	// Stopped once loaded (-S): the agent's port is hot-plugged before
	// the guest runs on. The stream is the descriptor after the tap's
	// (3, deviceArgs), if any, taken in once QMP has set the migration's
	// capabilities (incoming).
	args = append(args, "-S", "-incoming", "defer")
	extra := []*os.File{state}
	if cfg.Net != nil {
		extra = []*os.File{cfg.Net.Tap, state}
	}
	v, err := startQEMU(cfg, args, extra)
	if err != nil {
		return nil, err
	}
	defer func() {
		if err != nil {
			v.Close()
		}
	}()
	if err := v.incoming(ctx, 2+len(extra)); err != nil {
		return nil, err
	}
	if err := v.waitLoaded(ctx); err != nil {
		return nil, err
	}
	if err := v.qmp(ctx, "cont", nil); err != nil {
		return nil, err
	}
	sock, portID, err := v.hotplugPort(ctx)
	if err != nil {
		return nil, err
	}
	ping, err := v.connect(ctx, sock, portID, "the restored guest's agent")
	if err != nil {
		return nil, err
	}
	v.Ready = time.Since(t0)
	v.GuestUptime = time.Duration(ping.UptimeMs * float64(time.Millisecond))
	v.restored(ctx)
	if n := cfg.Net; n != nil {
		// The guest's eth0 has the checkpoint's address, and its
		// neighbours the old tap: without this it reaches nothing.
		var r struct{}
		nw := &guest.Network{Addr: n.Addr.String(), Gateway: n.Gateway.String()}
		if err := v.call(ctx, guest.Request{Op: "network", Network: nw}, nil, &r); err != nil {
			return nil, fmt.Errorf("microvm: give the restored guest its address: %w", err)
		}
	}
	return v, nil
}

// incoming has the restore's QEMU (-incoming defer) load its stream from
// descriptor fd, with the capabilities the checkpoint's had.
func (v *VM) incoming(ctx context.Context, fd int) error {
	var c *qmp.Client
	for {
		// QMP listens once QEMU has made its machine.
		var err error
		if c, err = qmp.Dial(ctx, filepath.Join(v.cfg.Dir, qmpSocket)); err == nil {
			break
		}
		select {
		case <-v.done:
			return errdefs.Internalf("microvm: QEMU exited before it took the checkpoint: %v (console: %s)", v.err, v.consoleTail())
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(5 * time.Millisecond):
		}
	}
	defer c.Close()
	if v.cfg.PMEM {
		if err := ignoreShared(ctx, c); err != nil {
			return err
		}
	}
	if err := c.Run(ctx, "migrate-incoming", map[string]any{"uri": "fd:" + strconv.Itoa(fd)}, nil); err != nil {
		return errdefs.Wrap(errdefs.Internal, err, "microvm: QMP migrate-incoming")
	}
	return nil
}

// waitLoaded waits until QEMU has loaded the incoming stream (it leaves
// "inmigrate"; it exits if the load fails).
func (v *VM) waitLoaded(ctx context.Context) error {
	for {
		var st qmp.Status
		err := v.qmp(ctx, "query-status", &st)
		if err == nil && st.Status != "inmigrate" {
			if st.Status != "paused" && st.Status != "prelaunch" {
				return errdefs.Internalf("microvm: the restored VM is %q, not paused", st.Status)
			}
			return nil
		}
		select {
		case <-v.done:
			return errdefs.Internalf("microvm: QEMU did not load the checkpoint: %v (console: %s)", v.err, v.consoleTail())
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(10 * time.Millisecond):
		}
	}
}

// restored tells the agent it was restored: it reseeds the guest's random
// number generator with the node's randomness and sets its clock to the
// node's. Best effort: an agent older than this answers Unsupported, and
// the sandbox works on (its randomness then that of the checkpoint until
// the guest reseeds itself).
func (v *VM) restored(ctx context.Context) {
	seed := make([]byte, 64)
	_, _ = rand.Read(seed)
	cctx, cancel := context.WithTimeout(ctx, statsTimeout)
	defer cancel()
	var r struct{}
	_ = v.call(cctx, guest.Request{Op: "restored", Restored: &guest.Restored{Seed: seed, UnixNano: time.Now().UnixNano()}}, nil, &r)
}
