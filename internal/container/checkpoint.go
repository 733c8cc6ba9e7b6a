package container

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"log/slog"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	criu "github.com/checkpoint-restore/go-criu/v7"
	"github.com/checkpoint-restore/go-criu/v7/rpc"
	"github.com/vishvananda/netlink"
	vnetns "github.com/vishvananda/netns"
	"golang.org/x/sys/unix"
	"google.golang.org/protobuf/proto"

	"github.com/warrenrl/warren/internal/backend"
	"github.com/warrenrl/warren/internal/cgroups"
	"github.com/warrenrl/warren/internal/cleanup"
	"github.com/warrenrl/warren/internal/errdefs"
	"github.com/warrenrl/warren/internal/kfile"
	"github.com/warrenrl/warren/internal/mountinfo"
	"github.com/warrenrl/warren/internal/netpolicy"
	"github.com/warrenrl/warren/internal/treecopy"
)

// CRIUPrefix is where scripts/criu.sh installs CRIU >= 4.2 (Debian forky's,
// run through its own loader); CRIUPath is the binary Warren runs. A
// variable for tests.
var (
	CRIUPrefix = "/opt/warren/criu"
	CRIUPath   = CRIUPrefix + "/bin/criu"
)

// A checkpoint directory holds:
//
//	images/          CRIU's images of the process tree (dump.log, restore.log)
//	upper/           the sandbox's writable layer, moved, not copied
//	checkpoint.json  what restore must hand CRIU back (checkpointMeta)
//
// netnsKey names the sandbox's network namespace as CRIU's external one.
const netnsKey = "warren-netns"

const (
	ckptImages = "images"
	ckptUpper  = "upper"
	ckptMeta   = "checkpoint.json"
	ckptShm    = "shm" // the files of the sandbox's /dev/shm
)

// checkpointMeta names the files of the dumped tree that live outside it
// and that restore passes in as already open (CRIU's inherit-fd): the
// agent's listening socket, which the daemon made, and the init's stdio,
// the node's /dev/null.
type checkpointMeta struct {
	// ID is the checkpointed sandbox's: a restore under another id (a
	// fork) finds the host paths CRIU recorded under it.
	ID string `json:"id,omitempty"`
	// Cgroups is the init's cgroup in every hierarchy when it was
	// dumped (cgroupsOf), for cgroupRoots.
	Cgroups map[string]string `json:"cgroups,omitempty"`
	// DevMounts are the keys of the binds of the sandbox's /dev
	// directory -> their path in it ("" for the directory itself).
	DevMounts map[string]string `json:"dev_mounts,omitempty"`
	// NodeMounts are the keys of the binds of the node's shared
	// filesystems: key -> <name>/<path in it> (nodeBinds).
	NodeMounts map[string]string `json:"node_mounts,omitempty"`
	// Net is the sandbox's network when it was dumped: its restore asks
	// for the same address.
	Net *netpolicy.Attachment `json:"net,omitempty"`
	// SocketKey is the agent socket's CRIU key ("socket:[ino]").
	SocketKey string `json:"socket_key"`
	// NullKey is the external file key of the init's stdio
	// ("file[mnt_id:ino]", hex), "" where it was no external file.
	NullKey string `json:"null_key,omitempty"`
	// UserNS is the sandbox's id mapping, which CRIU recorded and
	// restores (a fork runs with its source's ids); nil: none. Its
	// network namespace is then not in the images: CRIU ran in it
	// (criuNetns), and a restore runs CRIU in the one it made.
	UserNS *UserNS `json:"userns,omitempty"`
}

var _ backend.Checkpointer = (*sandbox)(nil)

// criuAvailable says why this node cannot checkpoint, or nil.
func criuAvailable() error {
	if _, err := os.Stat(CRIUPath); err != nil {
		why := "not installed"
		if b, err := os.ReadFile(CRIUPrefix + ".error"); err == nil {
			why = strings.TrimSpace(string(b))
		}
		return errdefs.New(errdefs.Unsupported, "this node cannot checkpoint sandboxes: no CRIU >= 4.2 at %s (%s); scripts/criu.sh installs it", CRIUPath, why)
	}
	return nil
}

// Checkpoint dumps the sandbox's process tree with CRIU into dir/images,
// which kills it, and moves its writable layer to dir/upper
// (backend.Checkpointer).
func (s *sandbox) Checkpoint(ctx context.Context, dir string) (retErr error) {
	select {
	case <-s.exited.Done():
		return errdefs.Conflictf("sandbox %s is not running", s.id)
	default:
	}
	if err := criuAvailable(); err != nil {
		return err
	}
	// A dump reads every page: a lazy restore must have put them back.
	if err := s.lazyFilled(ctx, 30*time.Second); err != nil {
		return err
	}
	pid := s.st.Pid
	// CRIU cannot dump a connection whose other end is the daemon's: the
	// agent must have let go of every connection but its listener.
	if err := agentIdle(ctx, pid, 2*time.Second); err != nil {
		return err
	}
	meta, err := externalFiles(pid)
	if err != nil {
		return err
	}
	if meta.Cgroups, err = cgroupsOf(pid); err != nil {
		return errdefs.Wrap(errdefs.Internal, err, "read the sandbox's cgroups")
	}
	images := filepath.Join(dir, ckptImages)
	if err := os.MkdirAll(images, 0o700); err != nil {
		return fsErr(err, "create checkpoint directory")
	}
	imgDir, err := os.Open(images)
	if err != nil {
		return fsErr(err, "open checkpoint directory")
	}
	defer imgDir.Close()
	external := []string{
		// Binds of other host directories (none today) are recorded by
		// their host paths and bound again from there on restore.
		"mnt[]",
	}
	// Binds of the node's shared filesystems (sysfs, the empty, views
	// and agent filesystems) are named by keys, and bound on restore
	// from that node's own (under its run directory, which another node
	// sharing the checkpoint directory has elsewhere).
	nodes, err := nodeBinds(pid, s.b.sharedFS())
	if err != nil {
		return errdefs.Wrap(errdefs.Internal, err, "read the sandbox's mounts")
	}
	for point, key := range nodes.points {
		external = append(external, "mnt["+point+"]:"+key)
	}
	meta.NodeMounts = nodes.keys
	// Binds of the sandbox's own /dev directory (/dev, and the masked
	// files bound from its null) are named by keys instead: a restore
	// under another id (a fork) binds them from its own directory.
	devs, err := devBinds(pid, s.id)
	if err != nil {
		return errdefs.Wrap(errdefs.Internal, err, "read the sandbox's mounts")
	}
	for point, key := range devs.points {
		external = append(external, "mnt["+point+"]:"+key)
	}
	meta.DevMounts = devs.keys
	if meta.NullKey != "" {
		external = append(external, meta.NullKey)
	}
	// The network namespace is the node's to make (a restore makes a new
	// one and hands it in): CRIU records it as external instead of
	// dumping its links, routes and sysctls, which cost more than the
	// rest of the dump of an idle sandbox. In a user namespace it is not
	// in the images at all: CRIU runs in it (criuNetns).
	netns, err := os.Open(fmt.Sprintf("/proc/%d/ns/net", pid))
	if err != nil {
		return errdefs.Wrap(errdefs.Internal, err, "open the sandbox's network namespace")
	}
	defer netns.Close()
	if s.st.UserNS == nil {
		var nst unix.Stat_t
		if err := unix.Fstat(int(netns.Fd()), &nst); err != nil {
			return errdefs.Wrap(errdefs.Internal, err, "stat the sandbox's network namespace")
		}
		external = append(external, fmt.Sprintf("net[%d]:%s", nst.Ino, netnsKey))
	}
	opts := &rpc.CriuOpts{
		ImagesDirFd: proto.Int32(int32(imgDir.Fd())),
		Pid:         proto.Int32(int32(pid)),
		LogLevel:    proto.Int32(4),
		LogFile:     proto.String("dump.log"),
		External:    external,
		// The sandbox's network namespace is locked while it is dumped;
		// the node has nftables, not iptables.
		NetworkLock:       rpc.CriuNetworkLockMethod_NFTABLES.Enum(),
		ManageCgroups:     proto.Bool(true),
		ManageCgroupsMode: rpc.CriuCgMode_SOFT.Enum(),
		TcpEstablished:    proto.Bool(true),
		FileLocks:         proto.Bool(true),
	}
	// CRIU kills the tree while it traces it: the init's exit reaches
	// the monitor before CRIU lets go of it, when the daemon (its parent)
	// cannot collect it yet, and the monitor's one try leaves a zombie.
	// A pidfd taken now reaps it once the dump is over.
	pidfd, err := unix.PidfdOpen(pid, 0)
	if err != nil {
		return errdefs.Wrap(errdefs.Internal, err, "pidfd_open sandbox init")
	}
	defer unix.Close(pidfd)
	c := criu.MakeCriu()
	c.SetCriuPath(CRIUPath)
	if s.st.UserNS != nil {
		if err := criuNetns(int(netns.Fd()), c.Prepare); err != nil {
			return errdefs.Wrap(errdefs.Internal, err, "start criu")
		}
		defer c.Cleanup()
	} else {
		// Started with the kernel data cache (kdat.go); Dump uses it.
		if err := startCRIU(c.Prepare); err != nil {
			return errdefs.Wrap(errdefs.Internal, err, "start criu")
		}
		defer c.Cleanup()
	}
	if err := c.Dump(opts, nil); err != nil {
		// CRIU resumes the tree when a dump fails: the sandbox runs on.
		return errdefs.Wrap(errdefs.Unsupported, fmt.Errorf("%w: %s", err, criuLogErrors(filepath.Join(images, "dump.log"))), "checkpoint sandbox "+s.id)
	}
	// CRIU killed the tree once its images were written; the init's exit
	// reaches the monitor.
	select {
	case <-s.exited.Done():
	case <-time.After(10 * time.Second):
		return errdefs.Internalf("sandbox %s: init still alive after its checkpoint", s.id)
	}
	reapTraced(pidfd)
	if u := s.st.UserNS; u != nil {
		// CRIU's restore reads images from the tasks it made, as root of
		// the user namespace it made (host id Base), which holds no
		// capability over the node's files: the images are its. The
		// root task opens some (timens) before CRIU has written its id
		// map, when it is nobody's: the directory is searchable by all,
		// and the files (0644, as CRIU writes them) readable. Only the
		// node reaches them (the checkpoint directory is 0700).
		if err := chownTree(images, int(u.Base)); err != nil {
			return fsErr(err, "give the checkpoint's images to the sandbox's root")
		}
		if err := os.Chmod(images, 0o711); err != nil {
			return fsErr(err, "give the checkpoint's images to the sandbox's root")
		}
	}
	// A rename, or a copy where the checkpoint directory is on another
	// filesystem (a store shared by several nodes).
	if err := treecopy.Move(s.UpperDir(), filepath.Join(dir, ckptUpper)); err != nil {
		return fsErr(err, "move the writable layer into the checkpoint")
	}
	// /dev/shm is a directory of the sandbox's /dev, on the node's devfs
	// tmpfs, which the checkpoint does not hold: its files are copied in
	// (POSIX shared memory and semaphores a restored process has mapped
	// must be there for CRIU to map them again).
	if err := copyTree(filepath.Join(s.b.devDir(s.id), "shm"), filepath.Join(dir, ckptShm)); err != nil {
		return fsErr(err, "copy /dev/shm into the checkpoint")
	}
	meta.ID = s.id
	meta.Net = s.network()
	meta.UserNS = s.st.UserNS
	b, _ := json.Marshal(meta)
	if err := os.WriteFile(filepath.Join(dir, ckptMeta), b, 0o600); err != nil {
		return fsErr(err, "write checkpoint metadata")
	}
	if u := s.st.UserNS; u != nil {
		// The sandbox comes back with these ids: they stay taken while
		// the checkpoint exists (ReleaseCheckpoint).
		_ = s.b.ids.claim(checkpointHolder(dir), *u)
	}
	return syncDir(dir)
}

// HoldCheckpoint keeps the id range of the checkpoint in dir taken, as
// its Checkpoint did, for a daemon that finds it at start
// (backend.CheckpointHolder).
func (b *Backend) HoldCheckpoint(dir string) error { return b.holdCheckpoint(dir, false) }

// AdmitCheckpoint holds the checkpoint in dir, made on another node, if
// this node can restore it: Conflict when its id range is another
// sandbox's here.
func (b *Backend) AdmitCheckpoint(dir string) error { return b.holdCheckpoint(dir, true) }

func (b *Backend) holdCheckpoint(dir string, exclusive bool) error {
	mb, err := os.ReadFile(filepath.Join(dir, ckptMeta))
	if err != nil {
		return fsErr(err, "read checkpoint metadata")
	}
	var meta checkpointMeta
	if err := json.Unmarshal(mb, &meta); err != nil {
		return errdefs.Wrap(errdefs.Invalid, err, "checkpoint metadata")
	}
	if meta.UserNS == nil {
		return nil
	}
	if exclusive {
		return b.ids.claimFrom(meta.ID, dir, *meta.UserNS, checkpointHolder(dir))
	}
	return b.ids.claim(checkpointHolder(dir), *meta.UserNS)
}

// ReleaseCheckpoint lets go of what the checkpoint in dir holds on the
// node (its id range), once it is discarded or another node took it.
func (b *Backend) ReleaseCheckpoint(dir string) { b.ids.releaseHolder(checkpointHolder(dir)) }

var _ backend.CheckpointHolder = (*Backend)(nil)

// devMountsOf are a sandbox's binds of its own /dev directory: mount
// point -> key, and key -> path in the directory.
type devMountsOf struct {
	points map[string]string
	keys   map[string]string
}

// devBinds finds the mounts of init pid's namespace whose source is the
// sandbox's /dev directory on the node's devfs (their root is /<id> or
// below it).
func devBinds(pid int, id string) (devMountsOf, error) {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/mountinfo", pid))
	if err != nil {
		return devMountsOf{}, err
	}
	out := devMountsOf{points: map[string]string{}, keys: map[string]string{}}
	for _, m := range mountinfo.Parse(string(b)) {
		if m.FSType != "tmpfs" {
			continue
		}
		rel, ok := strings.CutPrefix(m.Root, "/"+id)
		if !ok || (rel != "" && !strings.HasPrefix(rel, "/")) {
			continue
		}
		key := "warren-dev" + strings.ReplaceAll(rel, "/", "-")
		out.points[m.Point] = key
		out.keys[key] = strings.TrimPrefix(rel, "/")
	}
	if len(out.points) == 0 {
		return out, fmt.Errorf("no bind of its /dev directory in its mount table")
	}
	return out, nil
}

// agentIdle waits until the agent (pid, the init) holds no socket but
// its listener: the connections of calls that just ended close on its
// side a moment later. Calls still in flight make it a Conflict.
func agentIdle(ctx context.Context, pid int, wait time.Duration) error {
	deadline := time.Now().Add(wait)
	for {
		n, err := socketsOf(pid)
		if err != nil {
			return errdefs.Wrap(errdefs.Internal, err, "list the agent's descriptors")
		}
		if n <= 1 {
			return nil
		}
		if time.Now().After(deadline) {
			return errdefs.Conflictf("the sandbox's agent still serves %d connections (an exec, a stream or a process being waited for): checkpoint once they ended", n-1)
		}
		select {
		case <-ctx.Done():
			return errdefs.Wrap(errdefs.DeadlineExceeded, ctx.Err(), "wait for the agent's connections to end")
		case <-time.After(5 * time.Millisecond):
		}
	}
}

// socketsOf counts the sockets among pid's descriptors.
func socketsOf(pid int) (int, error) {
	dir := fmt.Sprintf("/proc/%d/fd", pid)
	ents, err := os.ReadDir(dir)
	if err != nil {
		return 0, err
	}
	n := 0
	for _, e := range ents {
		if l, err := os.Readlink(filepath.Join(dir, e.Name())); err == nil && strings.HasPrefix(l, "socket:") {
			n++
		}
	}
	return n, nil
}

// externalFiles finds the files of init pid that CRIU cannot dump: the
// agent socket (fd 4) and the node's /dev/null (stdio).
func externalFiles(pid int) (checkpointMeta, error) {
	var m checkpointMeta
	var st unix.Stat_t
	fd := "/proc/" + strconv.Itoa(pid) + "/fd/"
	if err := unix.Stat(fd+"4", &st); err != nil || st.Mode&unix.S_IFMT != unix.S_IFSOCK {
		return m, errdefs.Internalf("sandbox init %d: no agent socket at fd 4 (%v)", pid, err)
	}
	m.SocketKey = "socket:[" + strconv.FormatUint(st.Ino, 10) + "]"
	if err := unix.Stat(fd+"0", &st); err != nil {
		return m, errdefs.Wrap(errdefs.Internal, err, "stat sandbox init stdio")
	}
	if st.Mode&unix.S_IFMT == unix.S_IFCHR {
		info, err := kfile.Read("/proc/" + strconv.Itoa(pid) + "/fdinfo/0")
		if err != nil {
			return m, errdefs.Wrap(errdefs.Internal, err, "read sandbox init stdio")
		}
		mnt := fdinfoField(info, "mnt_id")
		if mnt == "" {
			return m, errdefs.Internalf("sandbox init %d: no mnt_id for its stdio", pid)
		}
		id, _ := strconv.ParseUint(mnt, 10, 64)
		m.NullKey = fmt.Sprintf("file[%x:%x]", id, st.Ino)
	}
	return m, nil
}

func fdinfoField(b []byte, name string) string {
	for line := range bytes.Lines(b) {
		if k, v, ok := strings.Cut(string(line), ":"); ok && k == name {
			return strings.TrimSpace(v)
		}
	}
	return ""
}

// criuLogErrors is the Error lines of a CRIU log, for the caller's error.
func criuLogErrors(path string) string {
	b, err := os.ReadFile(path)
	if err != nil {
		return "no CRIU log"
	}
	var out []string
	for line := range strings.Lines(string(b)) {
		if strings.Contains(line, "Error (") && !strings.Contains(line, "RLIMIT_NOFILE") && !strings.Contains(line, "tables") {
			out = append(out, strings.TrimSpace(line))
		}
	}
	if len(out) > 5 {
		out = out[len(out)-5:]
	}
	return strings.Join(out, "; ") + " (" + path + ")"
}

func syncDir(dir string) error {
	f, err := os.Open(dir)
	if err != nil {
		return fsErr(err, "open "+dir)
	}
	defer f.Close()
	if err := f.Sync(); err != nil {
		return fsErr(err, "sync "+dir)
	}
	return nil
}

// restore is Create from a checkpoint directory: the writable layer moves
// back, the overlay is mounted on the host for CRIU's --root, and CRIU
// restores the tree into a new cgroup and a network namespace made here
// (so that the agent's socket, made in it, can be checkpointed again).
func (b *Backend) restore(ctx context.Context, spec backend.Spec) (_ backend.Sandbox, retErr error) {
	if err := criuAvailable(); err != nil {
		return nil, err
	}
	dir := spec.Restore
	var meta checkpointMeta
	mb, err := os.ReadFile(filepath.Join(dir, ckptMeta))
	if err != nil {
		return nil, errdefs.Wrap(errdefs.Invalid, err, "not a checkpoint directory")
	}
	if err := json.Unmarshal(mb, &meta); err != nil {
		return nil, errdefs.Wrap(errdefs.Invalid, err, "checkpoint metadata")
	}
	if (meta.UserNS != nil) != spec.UserNS {
		return nil, errdefs.Invalidf("sandbox %s: the checkpoint's user-namespace mode (%v) is not the spec's (%v)", spec.ID, meta.UserNS != nil, spec.UserNS)
	}
	if err := b.ensureShared(); err != nil {
		return nil, err
	}
	var cu cleanup.Cleanup
	defer func() {
		if retErr != nil {
			_ = cu.Clean()
		}
	}()
	if meta.UserNS != nil {
		// CRIU restores the id map it recorded: this sandbox holds its
		// source's range (idPool).
		if err := b.ids.claimFrom(spec.ID, dir, *meta.UserNS, spec.ID); err != nil {
			return nil, err
		}
		cu.Add(func() error { b.ids.release(spec.ID, *meta.UserNS); return nil })
	}
	run, st := b.runDir(spec.ID), b.stateDir(spec.ID)
	if err := mkdir(run); err != nil {
		if errors.Is(err, os.ErrExist) {
			return nil, errdefs.AlreadyExistsf("sandbox %s already exists on this node", spec.ID)
		}
		return nil, fsErr(err, "create sandbox directories")
	}
	cu.Add(func() error { return b.removeDirs(spec.ID, -1) })
	if err := mkdir(st); err != nil && !errors.Is(err, os.ErrExist) {
		return nil, fsErr(err, "create sandbox directories")
	}
	if spec.DiskBytes > 0 {
		// A disk limit: the writable layer comes back onto a new disk of
		// its own, as at create (copied in below, as it was copied out).
		if err := mountDisk(b.diskImage(spec.ID), st, spec.DiskBytes); err != nil {
			return nil, err
		}
		cu.Add(func() error { return unmountDisk(b.diskImage(spec.ID), st) })
	}
	upper, work := filepath.Join(st, "upper"), filepath.Join(st, "work")
	if err := treecopy.Move(filepath.Join(dir, ckptUpper), upper); err == nil {
		// A failed restore leaves the checkpoint as it found it.
		cu.Add(func() error { return treecopy.Move(upper, filepath.Join(dir, ckptUpper)) })
	} else if errors.Is(err, os.ErrNotExist) {
		// Its writable layer became a lower layer the caller passes in
		// Layers (a fork's, or a forked checkpoint's own restore): this
		// sandbox writes on a fresh one.
		if err := os.Mkdir(upper, 0o755); err != nil && !errors.Is(err, os.ErrExist) {
			return nil, fsErr(err, "create sandbox directories")
		}
		// Its root directory is the sandbox's root's, as at create.
		if err := shiftOwner(upper, meta.UserNS, 0, 0); err != nil {
			return nil, err
		}
	} else {
		return nil, fsErr(err, "move the checkpoint's writable layer back")
	}
	if err := os.Mkdir(work, 0o755); err != nil && !errors.Is(err, os.ErrExist) {
		return nil, fsErr(err, "create sandbox directories")
	}
	var lazy *lazyServer
	// Where the kernel has no userfaultfd the memory comes back eagerly;
	// for a sandbox in a user namespace also where its tasks may not
	// open one (uffdForUserNS). The reason goes back to the client.
	var eagerWhy string
	if spec.LazyPages {
		if why := lazyRestore(meta.UserNS != nil); why != nil {
			eagerWhy = why.Error()
		} else {
			// Started first: it probes the kernel while the rest is made.
			if lazy, err = startLazyPages(filepath.Join(dir, ckptImages), st, run); err != nil {
				return nil, err
			}
			cu.Add(lazy.discard)
		}
	}
	// The dumped /dev and the masked files are binds of the sandbox's
	// /dev directory, named by keys (devBinds): they are bound from this
	// sandbox's own, made again here (delete removed the checkpointed
	// one's; a fork has its own id).
	src := meta.ID
	if src == "" {
		src = spec.ID
	}
	if len(meta.DevMounts) == 0 && src != spec.ID {
		return nil, errdefs.Unsupportedf("checkpoint of sandbox %s was taken by an older daemon: it restores only as itself", src)
	}
	_ = removeTree(b.devDir(spec.ID))
	if err := makeDevDir(b.devDir(spec.ID)); err != nil {
		return nil, err
	}
	if err := copyTree(filepath.Join(dir, ckptShm), filepath.Join(b.devDir(spec.ID), "shm")); err != nil {
		return nil, fsErr(err, "copy /dev/shm back from the checkpoint")
	}
	overlay, err := overlayConfig(spec.Layers, upper, work)
	if err != nil {
		return nil, err
	}
	root := b.rootfs(spec.ID)
	if err := os.Mkdir(root, 0o755); err != nil {
		return nil, fsErr(err, "create restore root")
	}
	lower := overlay["lower"]
	if meta.UserNS != nil {
		// As the init stage stacks them (init_linux.c, mount_overlay):
		// the image's layers idmapped through the sandbox's ids.
		l, fds, err := idmappedLowers(spec.Layers, *meta.UserNS)
		defer func() {
			for _, fd := range fds {
				unix.Close(fd)
			}
		}()
		if err != nil {
			return nil, err
		}
		lower = l
	}
	data := "lowerdir=" + lower + ",upperdir=" + upper + ",workdir=" + work + "," + overlay["overlay_options"]
	if err := unix.Mount("overlay", root, "overlay", unix.MS_NODEV, data); err != nil {
		return nil, errdefs.Wrap(errdefs.Internal, err, "mount the restored root")
	}
	// The restored tree holds its own copy; the host's goes either way.
	defer unmount(root)

	grp, err := cgroups.New(b.opts.CgroupParent, spec.ID, cgroups.Resources{
		CPUMillis: spec.CPUMillis, MemoryBytes: spec.MemoryBytes, PidsMax: spec.PidsMax,
	})
	if err != nil {
		return nil, err
	}
	cu.Add(func() error { _ = grp.Kill(5 * time.Second); return grp.Delete() })

	var ln, nsFile *os.File
	var net *netpolicy.Attachment
	hostname := spec.Hostname
	if hostname == "" {
		hostname = spec.ID
	}
	if !spec.Network.IsNone() && meta.Net != nil && src == spec.ID {
		// Its address, where no sandbox took it meanwhile (a fork's
		// source may run with it).
		b.net.Prefer(spec.ID, meta.Net.Index)
	}
	err = inNewNetns(func() error {
		lo, err := netlink.LinkByName("lo")
		if err == nil {
			err = netlink.LinkSetUp(lo)
		}
		if err != nil {
			return errdefs.Wrap(errdefs.Internal, err, "set up the restored sandbox's loopback")
		}

		if ln, err = listenUnixHidden(b.socket(spec.ID)); err != nil {
			return errdefs.Wrap(errdefs.Internal, err, "agent socket")
		}
		// The agent made its listener non-blocking when it started
		// (agent_linux.c); CRIU hands this one over as it is.
		if err := unix.SetNonblock(int(ln.Fd()), true); err != nil {
			return errdefs.Wrap(errdefs.Internal, err, "agent socket")
		}
		if nsFile, err = os.Open("/proc/thread-self/ns/net"); err != nil {
			return errdefs.Wrap(errdefs.Internal, err, "open the restored sandbox's network namespace")
		}
		if meta.UserNS != nil {
			// As the init stage sets it (init_linux.c): root in the
			// user namespace holds no CAP_NET_BIND_SERVICE over this
			// namespace, which the node's user namespace owns.
			if err := os.WriteFile("/proc/sys/net/ipv4/ip_unprivileged_port_start", []byte("0"), 0); err != nil {
				return errdefs.Wrap(errdefs.Internal, err, "allow low ports in the restored sandbox's network namespace")
			}
		}
		return nil
	})
	if ln != nil {
		defer ln.Close()
	}
	if nsFile != nil {
		defer nsFile.Close()
	}
	if err != nil {
		return nil, err
	}
	if !spec.Network.IsNone() {
		// Its interface and rules, made into the new namespace from the
		// node's (this goroutine's thread is in the daemon's), as create
		// makes them into the init's.
		a, err := b.net.AttachNS(spec.ID, hostname, vnetns.NsHandle(nsFile.Fd()), spec.Network)
		if err != nil {
			return nil, err
		}
		net = &a
		cu.Add(func() error { return b.net.Detach(spec.ID, a) })
	}
	null, err := devNull()
	if err != nil {
		return nil, errdefs.Wrap(errdefs.Internal, err, "open /dev/null")
	}
	images := filepath.Join(dir, ckptImages)
	imgDir, err := os.Open(images)
	if err != nil {
		return nil, fsErr(err, "open checkpoint images")
	}
	defer imgDir.Close()
	inherit := []*rpc.InheritFd{{Key: proto.String(meta.SocketKey), Fd: proto.Int32(int32(ln.Fd()))}}
	criuNS := int(nsFile.Fd())
	if meta.UserNS == nil {
		inherit = append(inherit, &rpc.InheritFd{Key: proto.String(netnsKey), Fd: proto.Int32(int32(nsFile.Fd()))})
	}
	if meta.NullKey != "" {
		inherit = append(inherit, &rpc.InheritFd{Key: proto.String(meta.NullKey), Fd: proto.Int32(int32(null.Fd()))})
	}
	// The log goes to the sandbox's run directory: the images stay as
	// they are for the next restore of them (forks).
	workDir, err := os.Open(run)
	if err != nil {
		return nil, fsErr(err, "open the sandbox's run directory")
	}
	defer workDir.Close()
	opts := &rpc.CriuOpts{
		ImagesDirFd:       proto.Int32(int32(imgDir.Fd())),
		WorkDirFd:         proto.Int32(int32(workDir.Fd())),
		LogLevel:          proto.Int32(4),
		LogFile:           proto.String("restore.log"),
		Root:              proto.String(root),
		External:          restoreExternal(meta.DevMounts, b.devDir(spec.ID), meta.NodeMounts, b.sharedFS()),
		InheritFd:         inherit,
		NetworkLock:       rpc.CriuNetworkLockMethod_NFTABLES.Enum(),
		ManageCgroups:     proto.Bool(true),
		ManageCgroupsMode: rpc.CriuCgMode_SOFT.Enum(),
		// The tree goes into the group made above: a fork's is not its
		// source's, which CRIU recorded.
		CgRoot:         cgroupRoots(meta.Cgroups, src, grp.Name()),
		TcpEstablished: proto.Bool(true),
		FileLocks:      proto.Bool(true),
	}
	if lazy != nil {
		if err := lazy.listening(); err != nil {
			return nil, err
		}
		opts.LazyPages = proto.Bool(true)
	}
	if net != nil {
		// Connections to the outside cannot come back (the peer moved
		// on; a fork has another address): every TCP connection is
		// restored closed, as after a network outage.
		opts.TcpClose = proto.Bool(true)
	}
	// Started with the kernel data cache (kdat.go), in a mount namespace
	// of its own: CRIU mounts its cgroup yard in its working directory,
	// which is opened again there.
	start := func(c *criu.Criu) error {
		return startCRIU(func() error {
			if err := reopenDir(workDir, run); err != nil {
				return err
			}
			return c.Prepare()
		})
	}
	var criuWD *os.File
	defer func() {
		if criuWD != nil {
			criuWD.Close()
		}
	}()
	if meta.UserNS != nil {
		// Every path CRIU binds or roots the tree at, under the run
		// directory: this sandbox's own and the node's shared ones.
		keep := []string{"sb/" + spec.ID, "devfs/" + spec.ID, "empty", "sysfs", "views", "agentfs"}
		start = func(c *criu.Criu) error {
			// CRIU mounts its cgroup yard in its working directory,
			// which must then be a mount of its own namespace (CRIU
			// opens it through this process's descriptor, kept open
			// until the restore is over).
			wd, err := criuUserNSView(criuNS, b.opts.RunDir, keep, run, c.Prepare)
			if wd != nil {
				criuWD = wd
				opts.WorkDirFd = proto.Int32(int32(wd.Fd()))
			}
			return err
		}
	}
	pid, err := criuRestore(opts, []*os.File{ln, null, nsFile, workDir}, start)
	if err != nil {
		return nil, errdefs.Wrap(errdefs.Internal, fmt.Errorf("%w: %s", err, criuLogErrors(filepath.Join(run, "restore.log"))), "restore sandbox "+spec.ID)
	}
	cu.Add(func() error { _ = unix.Kill(pid, unix.SIGKILL); return nil })

	s, err := b.attach(spec.ID, pid, -1, 0, grp, net)
	if err != nil {
		return nil, err
	}
	s.st.UserNS = meta.UserNS
	s.restoredLazy, s.eagerWhy = lazy != nil, eagerWhy
	b.cpus.adopt(spec.ID, pid)
	if pids, err := grp.Procs(); err != nil {
		return nil, err
	} else if err := applyQoS(grp, pids, spec.QoS); err != nil {
		return nil, err
	}
	// New processes get pids past every one the agent has a record of
	// (SetLastPID), as they would have had the sandbox run on. Without
	// it the daemon still tells them apart (it lets go of a record whose
	// pid was reused); this keeps the pids clients hold unique.
	if recs, err := s.agent.ListBackground(ctx); err == nil {
		last := 0
		for _, r := range recs {
			last = max(last, r.Pid)
		}
		if last > 0 {
			if err := SetLastPID(pid, last, true); err != nil {
				slog.Warn("restored sandbox: new processes may reuse the pids of exited ones", "sandbox", spec.ID, "err", err)
			}
		}
	}
	if lazy != nil {
		s.lazyMu.Lock()
		s.lazy = lazy
		s.lazyMu.Unlock()
		go s.watchLazy(lazy)
	}
	cu.Release()
	return s, nil
}

// restoreExternal are the restore's external mounts: the host binds by
// their recorded paths, and the /dev binds by key from dev.
func restoreExternal(devMounts map[string]string, dev string, nodeMounts map[string]string, shared map[string]string) []string {
	out := []string{"mnt[]"}
	for key, rel := range devMounts {
		out = append(out, "mnt["+key+"]:"+filepath.Join(dev, rel))
	}
	for key, rel := range nodeMounts {
		name, in, _ := strings.Cut(rel, "/")
		if dir, ok := shared[name]; ok {
			out = append(out, "mnt["+key+"]:"+filepath.Join(dir, in))
		}
	}
	return out
}

// sharedFS are the node's filesystems that sandboxes bind from, by name.
func (b *Backend) sharedFS() map[string]string {
	return map[string]string{"sysfs": b.sysfsDir(), "empty": b.emptyDir(), "views": b.viewsDir(), "agentfs": b.agentfsDir()}
}

// nodeBinds finds the mounts of init pid's namespace that bind one of
// the node's shared filesystems (by device) and names each by a key:
// mount point -> key, and key -> <name>/<path in that filesystem>.
func nodeBinds(pid int, shared map[string]string) (devMountsOf, error) {
	devs := map[string]string{} // "major:minor" -> name
	for name, dir := range shared {
		var st unix.Stat_t
		if err := unix.Stat(dir, &st); err != nil {
			continue // not made on this node (yet): nothing binds it
		}
		devs[fmt.Sprintf("%d:%d", unix.Major(st.Dev), unix.Minor(st.Dev))] = name
	}
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/mountinfo", pid))
	if err != nil {
		return devMountsOf{}, err
	}
	out := devMountsOf{points: map[string]string{}, keys: map[string]string{}}
	for _, m := range mountinfo.Parse(string(b)) {
		name, ok := devs[m.Dev]
		if !ok {
			continue
		}
		key := "warren-node-" + name + strings.ReplaceAll(m.Root, "/", "-")
		out.points[m.Point] = key
		out.keys[key] = name + m.Root
	}
	return out, nil
}

// cgroupsOf reads pid's cgroup of every hierarchy: controllers ("" for
// the v2 one) -> path.
func cgroupsOf(pid int) (map[string]string, error) {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/cgroup", pid))
	if err != nil {
		return nil, err
	}
	out := map[string]string{}
	for _, line := range strings.Split(strings.TrimSpace(string(b)), "\n") {
		parts := strings.SplitN(line, ":", 3)
		if len(parts) == 3 {
			out[parts[1]] = parts[2]
		}
	}
	return out, nil
}

// cgroupRoots tells CRIU where to put the restored tree in every
// hierarchy: where the checkpointed init had a group of its own (its path
// ends in its id), the group made for this sandbox; elsewhere (cpuset,
// blkio, a devices group shared by the node's sandboxes) where it was.
// Without it CRIU makes the checkpointed sandbox's groups again, which a
// fork must not share. An entry without a controller is CRIU's default,
// the v2 hierarchy's here.
func cgroupRoots(dumped map[string]string, srcID, name string) []*rpc.CgroupRoot {
	var out []*rpc.CgroupRoot
	for ctrls, p := range dumped {
		if strings.HasSuffix(p, "/"+srcID) {
			p = "/" + name
		}
		if ctrls == "" {
			out = append(out, &rpc.CgroupRoot{Path: proto.String(p)})
			continue
		}
		for _, c := range strings.Split(ctrls, ",") {
			out = append(out, &rpc.CgroupRoot{Ctrl: proto.String(c), Path: proto.String(p)})
		}
	}
	return out
}

// listenUnixHidden is listenUnix, bound through a descriptor of the
// socket's directory: the sandbox's /proc/net/unix shows the name given
// to bind, which then names no host path (init_linux.c, listen_at).
func listenUnixHidden(path string) (*os.File, error) {
	dir, err := os.Open(filepath.Dir(path))
	if err != nil {
		return nil, err
	}
	defer dir.Close()
	f, err := listenUnix(fmt.Sprintf("/proc/self/fd/%d/%s", dir.Fd(), filepath.Base(path)))
	if err != nil {
		return nil, err
	}
	return f, nil
}

var criuStartMu sync.Mutex

// criuRestore runs CRIU's restore through its RPC interface and returns
// the restored init's host pid. The files in pass reach CRIU's process
// under their own numbers (inherit-fd, join-ns name them): go-criu starts
// it with os/exec, which keeps only descriptors without close-on-exec, so
// theirs is cleared around the start. Another child the daemon starts in
// that moment inherits them too, and closes them when it exits. start
// starts CRIU (go-criu's Prepare through startCRIU, or criuUserNSView
// around it).
func criuRestore(opts *rpc.CriuOpts, pass []*os.File, start func(*criu.Criu) error) (int, error) {
	c := criu.MakeCriu()
	c.SetCriuPath(CRIUPath)
	// One start at a time: restores share descriptors (the node's
	// /dev/null), and one putting close-on-exec back while another's
	// CRIU starts would keep it from that one.
	criuStartMu.Lock()
	for _, f := range pass {
		if _, err := unix.FcntlInt(f.Fd(), unix.F_SETFD, 0); err != nil {
			criuStartMu.Unlock()
			return 0, err
		}
	}
	err := start(c)
	for _, f := range pass {
		syscall.CloseOnExec(int(f.Fd()))
	}
	criuStartMu.Unlock()
	if err != nil {
		return 0, fmt.Errorf("start criu: %w", err)
	}
	defer c.Cleanup()
	nfy := &restoreNotify{}
	if err := c.Restore(opts, nfy); err != nil {
		return 0, err
	}
	if nfy.pid <= 0 {
		return 0, errors.New("criu reported no restored pid")
	}
	return int(nfy.pid), nil
}

// restoreNotify takes the restored init's pid from CRIU's post-restore
// notification.
type restoreNotify struct {
	criu.NoNotify
	pid int32
}

func (n *restoreNotify) PostRestore(pid int32) error { n.pid = pid; return nil }

// makeDevDir makes a sandbox's /dev directory as the init stage does
// (init_linux.c, setup_dev; devEntries): CRIU binds it back as /dev and
// mounts the devpts instance on its pts. What the sandbox kept in /dev/shm
// is not in the checkpoint.
func makeDevDir(dir string) error {
	if err := os.Mkdir(dir, 0o755); err != nil {
		return fsErr(err, "create sandbox /dev")
	}
	old := unix.Umask(0)
	defer unix.Umask(old)
	for _, n := range []struct {
		name     string
		maj, min uint32
	}{{"null", 1, 3}, {"zero", 1, 5}, {"full", 1, 7}, {"random", 1, 8}, {"urandom", 1, 9}, {"tty", 5, 0}} {
		if err := unix.Mknod(filepath.Join(dir, n.name), unix.S_IFCHR|0o666, int(unix.Mkdev(n.maj, n.min))); err != nil {
			return fsErr(err, "create sandbox /dev/"+n.name)
		}
	}
	for _, d := range []struct {
		name string
		mode uint32
	}{{"pts", 0o755}, {"shm", 0o1777}} {
		if err := unix.Mkdir(filepath.Join(dir, d.name), d.mode); err != nil {
			return fsErr(err, "create sandbox /dev/"+d.name)
		}
	}
	// The mount point of the agent's executable (agentfs.go), which CRIU
	// binds again from the node's agent tmpfs.
	if err := os.WriteFile(filepath.Join(dir, filepath.Base(agentExeSandboxPath)), nil, 0); err != nil {
		return fsErr(err, "create sandbox "+agentExeSandboxPath)
	}
	for _, l := range [][2]string{{"pts/ptmx", "ptmx"}, {"/proc/self/fd", "fd"}, {"/proc/self/fd/0", "stdin"}, {"/proc/self/fd/1", "stdout"}, {"/proc/self/fd/2", "stderr"}} {
		if err := os.Symlink(l[0], filepath.Join(dir, l[1])); err != nil {
			return fsErr(err, "create sandbox /dev/"+l[1])
		}
	}
	return nil
}

// copyTree copies the directories, regular files and symlinks under src
// into dst (which may exist), with their modes and owners: a missing src
// copies nothing. Other file types (sockets, fifos) are left out.
func copyTree(src, dst string) error {
	return filepath.WalkDir(src, func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			if errors.Is(err, fs.ErrNotExist) && p == src {
				return nil
			}
			return err
		}
		rel, _ := filepath.Rel(src, p)
		to := filepath.Join(dst, rel)
		fi, err := d.Info()
		if err != nil {
			return err
		}
		st, _ := fi.Sys().(*syscall.Stat_t)
		switch {
		case d.IsDir():
			if err := os.Mkdir(to, fi.Mode().Perm()); err != nil && !errors.Is(err, fs.ErrExist) {
				return err
			}
			if err := os.Chmod(to, fi.Mode()&(fs.ModePerm|fs.ModeSticky|fs.ModeSetuid|fs.ModeSetgid)); err != nil {
				return err
			}
		case d.Type()&fs.ModeSymlink != 0:
			l, err := os.Readlink(p)
			if err != nil {
				return err
			}
			if err := os.Symlink(l, to); err != nil {
				return err
			}
		case d.Type().IsRegular():
			if err := copyFile(p, to, fi.Mode().Perm()); err != nil {
				return err
			}
		default:
			return nil
		}
		if st != nil {
			return os.Lchown(to, int(st.Uid), int(st.Gid))
		}
		return nil
	})
}

func copyFile(from, to string, mode fs.FileMode) error {
	in, err := os.Open(from)
	if err != nil {
		return err
	}
	defer in.Close()
	out, err := os.OpenFile(to, os.O_WRONLY|os.O_CREATE|os.O_TRUNC, mode)
	if err != nil {
		return err
	}
	if _, err := io.Copy(out, in); err != nil {
		out.Close()
		return err
	}
	if err := out.Chmod(mode); err != nil {
		out.Close()
		return err
	}
	return out.Close()
}

// reapTraced collects the init pidfd names if it is this daemon's child
// (ECHILD otherwise, or once the monitor has), waiting a little for the
// tracer to let go of it.
func reapTraced(pidfd int) {
	for range 100 {
		var info unix.Siginfo
		err := unix.Waitid(unix.P_PIDFD, pidfd, &info, unix.WEXITED|unix.WNOHANG, nil)
		if err == unix.EINTR {
			continue
		}
		if err != nil || info.Signo != 0 {
			return // reaped, or not ours to reap
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// criuNetns runs start (CRIU's start: go-criu's Prepare) on a thread in
// network namespace ns, so that CRIU runs there, for a sandbox in a user
// namespace. CRIU dumps a user namespace only when every namespace of the
// tree it can enter from there is owned by it (the mount, UTS and IPC
// ones are: init_linux.c, userns_namespaces), and a restore makes the
// tree's namespaces inside the user namespace it makes, into which it
// could not bring a network namespace the daemon made. The sandbox's
// network namespace stays the node's (its root holds no capability over
// it, as at create): with CRIU in it, it is CRIU's own, neither checked
// nor dumped, and the restored tree inherits it from CRIU. The agent's
// listener, made in it, is dumped as before.
func criuNetns(ns int, start func() error) error {
	if hostNetnsErr != nil {
		return hostNetnsErr
	}
	warmKdat()
	done := make(chan error, 1)
	go func() {
		// Never unlocked: the thread may end in a mount namespace of
		// its own (kdatView), and the runtime then ends it with the
		// goroutine.
		runtime.LockOSThread()
		if err := unix.Setns(ns, unix.CLONE_NEWNET); err != nil {
			done <- fmt.Errorf("enter the sandbox's network namespace: %w", err)
			return
		}
		if err := kdatView(); err != nil {
			done <- err
			return
		}
		// os/exec forks from this thread: the child starts here.
		done <- start()
	}()
	return <-done
}

// kdatView gives this thread (locked, never reused) the private /run with
// CRIU's kernel data cache (kdat.go), where the cache is made: a CRIU of
// a sandbox in a user namespace, started from a thread in its network
// namespace and views of its own, skips its kernel probe too. A failure
// after the new /run is mounted leaves the thread's view of it half
// made: an error, and no CRIU starts from it.
func kdatView() error {
	data := currentKdat()
	if data == nil {
		return nil
	}
	if err := privateRun(data); err != nil {
		return fmt.Errorf("criu's kernel data cache: %w", err)
	}
	return nil
}

// chownTree gives every file under dir to host id id (uid and gid).
func chownTree(dir string, id int) error {
	return filepath.WalkDir(dir, func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		return os.Lchown(p, id, id)
	})
}

// criuUserNSView starts CRIU (start: go-criu's Prepare) for the restore of
// a sandbox in a user namespace: in the sandbox's network namespace
// (netns, as criuNetns), and in a mount namespace of its own where the run
// directory's paths it needs (keep, relative to runDir) can be reached by
// the sandbox's root. CRIU builds the restored mount tree from a task
// inside the user namespace it makes, as host id Base, which binds the
// node's sources (its /dev directory, the shared sysfs, empty and views
// filesystems, the agent's file) and the root by their paths: the run
// directory, 0700, keeps it out. Here the highest directory on the way to
// it that others may not search is covered by a tmpfs (0711: searched,
// not listed) holding the way down and binds of the kept paths alone;
// nothing changes on the node, and the restored tree leaves this
// namespace behind when CRIU moves it onto its root. The thread ends with
// the goroutine: the runtime never reuses it.
// It returns workDir opened in that namespace, for CRIU's working directory.
func criuUserNSView(netns int, runDir string, keep []string, workDir string, start func() error) (*os.File, error) {
	warmKdat()
	var wd *os.File
	done := make(chan error, 1)
	go func() {
		runtime.LockOSThread()
		done <- func() (err error) {
			if err := unix.Setns(netns, unix.CLONE_NEWNET); err != nil {
				return fmt.Errorf("enter the sandbox's network namespace: %w", err)
			}
			if err := unix.Unshare(unix.CLONE_NEWNS | unix.CLONE_FS); err != nil {
				return fmt.Errorf("unshare a mount namespace for criu: %w", err)
			}
			if err := searchableView(runDir, keep); err != nil {
				return err
			}
			if err := kdatView(); err != nil {
				return err
			}
			if wd, err = os.Open(workDir); err != nil {
				return err
			}
			return start()
		}()
	}()
	err := <-done
	if err != nil && wd != nil {
		wd.Close()
		wd = nil
	}
	return wd, err
}

// searchableView makes keep (paths under runDir) reachable by any id in
// this thread's mount namespace (criuUserNSView).
func searchableView(runDir string, keep []string) error {
	if err := unix.Mount("", "/", "", unix.MS_SLAVE|unix.MS_REC, ""); err != nil {
		return fmt.Errorf("make criu's mounts private: %w", err)
	}
	top := ""
	for p := runDir; ; p = filepath.Dir(p) {
		var st unix.Stat_t
		if err := unix.Stat(p, &st); err != nil {
			return fmt.Errorf("stat %s: %w", p, err)
		}
		if st.Mode&0o001 == 0 {
			top = p
		}
		if p == "/" {
			break
		}
	}
	if top == "" {
		return nil
	}
	run, err := unix.Open(runDir, unix.O_PATH|unix.O_DIRECTORY|unix.O_CLOEXEC, 0)
	if err != nil {
		return fmt.Errorf("open %s: %w", runDir, err)
	}
	defer unix.Close(run)
	if err := unix.Mount("tmpfs", top, "tmpfs", unix.MS_NOSUID|unix.MS_NODEV|unix.MS_NOEXEC, "mode=0711,size=64k"); err != nil {
		return fmt.Errorf("cover %s for criu: %w", top, err)
	}
	for _, k := range keep {
		src := fmt.Sprintf("/proc/self/fd/%d/%s", run, k)
		fi, err := os.Stat(src)
		if errors.Is(err, fs.ErrNotExist) {
			continue
		}
		if err != nil {
			return err
		}
		dst := filepath.Join(runDir, k)
		if err := os.MkdirAll(filepath.Dir(dst), 0o711); err != nil {
			return err
		}
		if fi.IsDir() {
			err = os.Mkdir(dst, 0o711)
		} else {
			err = os.WriteFile(dst, nil, 0)
		}
		if err != nil {
			return err
		}
		if err := unix.Mount(src, dst, "", unix.MS_BIND|unix.MS_REC, ""); err != nil {
			return fmt.Errorf("bind %s for criu: %w", dst, err)
		}
	}
	return nil
}

// idmappedLowers are layers as overlayfs lower directories for a restore
// in user namespace u: the image's layers as detached clones idmapped
// through it (named /proc/self/fd/N; fds, which the caller closes once the
// overlay holds them), a fork's bases (HostIDs) as they are.
func idmappedLowers(layers []backend.Layer, u UserNS) (lower string, fds []int, err error) {
	ns, err := userNSOf(u)
	if err != nil {
		return "", nil, err
	}
	defer ns.Close()
	parts := make([]string, len(layers))
	for i, l := range layers {
		if l.HostIDs {
			parts[i] = l.Dir
			continue
		}
		fd, err := unix.OpenTree(unix.AT_FDCWD, l.Dir, unix.OPEN_TREE_CLONE|unix.OPEN_TREE_CLOEXEC)
		if err != nil {
			return "", fds, errdefs.Wrap(errdefs.Internal, err, "clone image layer "+l.Dir)
		}
		fds = append(fds, fd)
		attr := unix.MountAttr{Attr_set: unix.MOUNT_ATTR_IDMAP, Userns_fd: uint64(ns.Fd())}
		if err := unix.MountSetattr(fd, "", unix.AT_EMPTY_PATH, &attr); err != nil {
			return "", fds, errdefs.Wrap(errdefs.Internal, err, "idmap image layer "+l.Dir)
		}
		parts[i] = fmt.Sprintf("/proc/self/fd/%d", fd)
	}
	return strings.Join(parts, ":"), fds, nil
}

// userNSOf opens a user namespace mapping ids 0.. to u's host ids, for
// idmapped mounts. A multithreaded process cannot unshare one: a child is
// started in it, stopped by ptrace at its exec before it runs anything
// (the executable, CRIU's, never runs), and killed once it is open.
func userNSOf(u UserNS) (*os.File, error) {
	// Pdeathsig follows the thread that started the child.
	runtime.LockOSThread()
	defer runtime.UnlockOSThread()
	ids := []syscall.SysProcIDMap{{ContainerID: 0, HostID: int(u.Base), Size: int(u.Size)}}
	cmd := exec.Command(CRIUPath)
	cmd.SysProcAttr = &syscall.SysProcAttr{
		Cloneflags: syscall.CLONE_NEWUSER, UidMappings: ids, GidMappings: ids,
		Ptrace: true, Pdeathsig: syscall.SIGKILL,
	}
	if err := cmd.Start(); err != nil {
		return nil, errdefs.Wrap(errdefs.Internal, err, "make the sandbox's user namespace for its layers")
	}
	defer func() {
		_ = cmd.Process.Kill()
		_ = cmd.Wait()
	}()
	f, err := os.Open(fmt.Sprintf("/proc/%d/ns/user", cmd.Process.Pid))
	if err != nil {
		return nil, errdefs.Wrap(errdefs.Internal, err, "open the sandbox's user namespace for its layers")
	}
	return f, nil
}
