package bench

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync/atomic"
	"time"

	"golang.org/x/sys/unix"
)

// A peer is a system measured next to Warren: it is set up once, runs
// iterations returning the same metrics as Warren's rows, and is torn down.
type peer struct {
	system   string
	note     string
	setup    func(ctx context.Context) error // may set note
	iter     Iteration
	teardown func()
}

// runCmd executes a command and returns its error with its output.
func runCmd(ctx context.Context, name string, args ...string) error {
	cmd := exec.CommandContext(ctx, name, args...)
	var out bytes.Buffer
	cmd.Stderr = &out
	if err := cmd.Run(); err != nil {
		msg := strings.TrimSpace(out.String())
		if len(msg) > 300 {
			msg = msg[:300]
		}
		return fmt.Errorf("%s %s: %v: %s", name, strings.Join(args, " "), err, msg)
	}
	return nil
}

// ociRuntime drives crun or runc with a private state root.
type ociRuntime struct {
	bin      string
	root     string   // --root state directory
	global   []string // extra global flags (e.g. --cgroup-manager=disabled)
	hugetlb  string   // v1 hugetlb mount point, "" when not mounted
	ids      atomic.Int64
	idPrefix string
}

func newOCIRuntime(bin, tmp string) *ociRuntime {
	return &ociRuntime{
		bin:      bin,
		root:     filepath.Join(tmp, bin+"-state"),
		idPrefix: fmt.Sprintf("wb%d-%s-", os.Getpid(), bin),
	}
}

func (r *ociRuntime) args(a ...string) []string {
	return append(append([]string{"--root", r.root}, r.global...), a...)
}

func (r *ociRuntime) newID() string { return r.idPrefix + strconv.FormatInt(r.ids.Add(1), 10) }

func (r *ociRuntime) run(ctx context.Context, bundle, id string, detach bool) error {
	a := []string{"run", "--bundle", bundle}
	if detach {
		// The container keeps its stdio: an output pipe would never
		// reach EOF, so it gets /dev/null.
		a = append(a, "--detach")
		cmd := exec.CommandContext(ctx, r.bin, r.args(append(a, id)...)...)
		if err := cmd.Run(); err != nil {
			return fmt.Errorf("%s run --detach: %w", r.bin, err)
		}
		return nil
	}
	return runCmd(ctx, r.bin, r.args(append(a, id)...)...)
}

func (r *ociRuntime) delete(ctx context.Context, id string) error {
	return runCmd(ctx, r.bin, r.args("delete", "--force", id)...)
}

func (r *ociRuntime) exec(ctx context.Context, id string, argv ...string) error {
	return runCmd(ctx, r.bin, r.args(append([]string{"exec", id}, argv...)...)...)
}

// mountHugetlb binds the hugetlb controller to a temporary v1 hierarchy.
// Debian 12's crun 1.8 refuses hybrid hosts whose cgroup2 mount still owns
// a controller ("cgroups in hybrid mode not supported"); on these hosts
// that is only hugetlb, which no v1 hierarchy mounts. Only the crun peer
// does this; Warren never needs it.
func (r *ociRuntime) mountHugetlb(tmp string) error {
	dir := filepath.Join(tmp, "hugetlb")
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return err
	}
	if err := unix.Mount("none", dir, "cgroup", 0, "hugetlb"); err != nil {
		return fmt.Errorf("mount -t cgroup -o hugetlb none %s: %w", dir, err)
	}
	r.hugetlb = dir
	return nil
}

func (r *ociRuntime) unmountHugetlb() {
	if r.hugetlb == "" {
		return
	}
	// Containers may still be exiting; retry briefly.
	for i := 0; i < 50; i++ {
		if err := unix.Unmount(r.hugetlb, 0); err == nil || errors.Is(err, unix.EINVAL) {
			break
		}
		time.Sleep(20 * time.Millisecond)
	}
	_ = os.Remove(r.hugetlb)
	r.hugetlb = ""
}

// prepareCrun makes crun usable on this host and returns a note saying
// how: with a temporary hugetlb v1 mount (cgroups as usual), or, if that
// is not enough, with --cgroup-manager=disabled (no cgroups at all).
// probe runs one container with the current settings.
func (r *ociRuntime) prepareCrun(ctx context.Context, tmp string, probe func(context.Context) error) (string, error) {
	first := probe(ctx)
	if first == nil {
		return "crun works unmodified on this host", nil
	}
	var notes []string
	if err := r.mountHugetlb(tmp); err != nil {
		notes = append(notes, err.Error())
	} else if err := probe(ctx); err == nil {
		return "crun 1.8 refuses this hybrid-cgroup host until hugetlb is bound to a v1 hierarchy: " +
			"the benchmark mounts one (mount -t cgroup -o hugetlb) around the crun runs only; crun then uses per-container v1 cgroups like runc", nil
	} else {
		notes = append(notes, "with hugetlb mounted: "+err.Error())
		r.unmountHugetlb()
	}
	r.global = []string{"--cgroup-manager=disabled"}
	if err := probe(ctx); err == nil {
		return "crun needs --cgroup-manager=disabled on this host (no cgroups for the crun rows; " + strings.Join(notes, "; ") + ")", nil
	}
	r.global = nil
	return "", fmt.Errorf("crun does not work on this host: %v; %s", first, strings.Join(notes, "; "))
}

// writeBundle writes an OCI bundle in dir from `crun spec` (or `runc
// spec`), adjusted: the root is rootfs (writable), args are argv, no
// terminal. The namespaces, including network, are kept.
func writeBundle(ctx context.Context, dir, rootfs string, argv ...string) error {
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return err
	}
	cfgPath := filepath.Join(dir, "config.json")
	_ = os.Remove(cfgPath)
	var err error
	for _, bin := range []string{"crun", "runc"} {
		if _, lerr := exec.LookPath(bin); lerr != nil {
			continue
		}
		cmd := exec.CommandContext(ctx, bin, "spec")
		cmd.Dir = dir
		if out, rerr := cmd.CombinedOutput(); rerr != nil {
			err = fmt.Errorf("%s spec: %v: %s", bin, rerr, out)
			continue
		}
		err = nil
		break
	}
	if err != nil {
		return err
	}
	b, err := os.ReadFile(cfgPath)
	if err != nil {
		return fmt.Errorf("no OCI spec generator (crun or runc): %w", err)
	}
	var cfg map[string]any
	if err := json.Unmarshal(b, &cfg); err != nil {
		return err
	}
	cfg["root"] = map[string]any{"path": rootfs, "readonly": false}
	proc, _ := cfg["process"].(map[string]any)
	if proc == nil {
		return fmt.Errorf("spec without process section")
	}
	proc["args"] = argv
	proc["terminal"] = false
	out, err := json.MarshalIndent(cfg, "", "  ")
	if err != nil {
		return err
	}
	return os.WriteFile(cfgPath, out, 0o644)
}

func have(bin string) bool {
	_, err := exec.LookPath(bin)
	return err == nil
}

// unshareArgs is the bare-namespaces floor: the namespaces of a sandbox
// (mount, pid, uts, ipc, net), a chroot, no cgroup, no mounts.
func unshareArgs(rootfs string, argv ...string) []string {
	return append([]string{"--mount", "--pid", "--fork", "--uts", "--ipc", "--net", "chroot", rootfs}, argv...)
}

// runPeers is the "run /bin/true in a fresh container and clean up" peers
// of the create benchmark. Each iteration returns [run, run+cleanup].
func runPeers(tmp, rootfs string) []*peer {
	var peers []*peer
	bundle := filepath.Join(tmp, "bundle-true")
	if have("crun") {
		rt := newOCIRuntime("crun", tmp)
		p := &peer{system: "crun"}
		p.setup = func(ctx context.Context) error {
			if err := writeBundle(ctx, bundle, rootfs, "/bin/true"); err != nil {
				return err
			}
			note, err := rt.prepareCrun(ctx, tmp, func(ctx context.Context) error {
				id := rt.newID()
				err := rt.run(ctx, bundle, id, false)
				_ = rt.delete(ctx, id)
				return err
			})
			p.note = note
			return err
		}
		p.iter = ociRunIter(rt, bundle)
		p.teardown = rt.unmountHugetlb
		peers = append(peers, p)
	}
	if have("runc") {
		rt := newOCIRuntime("runc", tmp)
		peers = append(peers, &peer{
			system: "runc",
			setup: func(ctx context.Context) error {
				if err := writeBundle(ctx, bundle, rootfs, "/bin/true"); err != nil {
					return err
				}
				id := rt.newID()
				err := rt.run(ctx, bundle, id, false)
				_ = rt.delete(ctx, id)
				return err
			},
			iter:     ociRunIter(rt, bundle),
			teardown: func() {},
		})
	}
	if have("unshare") && have("chroot") {
		peers = append(peers, &peer{
			system: "unshare+chroot",
			note:   "unshare --mount --pid --fork --uts --ipc --net chroot ROOTFS /bin/true: namespaces only, no cgroup, no mounts (the floor)",
			setup: func(ctx context.Context) error {
				return runCmd(ctx, "unshare", unshareArgs(rootfs, "/bin/true")...)
			},
			iter: func(ctx context.Context, _ int) ([]time.Duration, error) {
				t0 := time.Now()
				if err := runCmd(ctx, "unshare", unshareArgs(rootfs, "/bin/true")...); err != nil {
					return nil, err
				}
				d := time.Since(t0)
				return []time.Duration{d, d}, nil
			},
			teardown: func() {},
		})
	}
	return peers
}

// ociRunIter: `<rt> run` of /bin/true, then `<rt> delete -f`.
func ociRunIter(rt *ociRuntime, bundle string) Iteration {
	return func(ctx context.Context, _ int) ([]time.Duration, error) {
		id := rt.newID()
		t0 := time.Now()
		err := rt.run(ctx, bundle, id, false)
		t1 := time.Now()
		_ = rt.delete(ctx, id) // cleanup; "does not exist" when run already removed it
		t2 := time.Now()
		if err != nil {
			return nil, err
		}
		return []time.Duration{t1.Sub(t0), t2.Sub(t0)}, nil
	}
}

// execPeers are the "run /bin/true in a running container" peers of the
// exec benchmark: crun exec and runc exec into a container running sleep,
// and nsenter into the Warren sandbox's namespaces (initPid). Each
// iteration returns [round trip].
func execPeers(tmp, rootfs string, initPid func() (int, error)) []*peer {
	var peers []*peer
	bundle := filepath.Join(tmp, "bundle-sleep")
	if have("crun") {
		rt := newOCIRuntime("crun", tmp)
		var id string
		p := &peer{system: "crun exec"}
		p.setup = func(ctx context.Context) error {
			if err := writeBundle(ctx, bundle, rootfs, "/bin/sleep", "1000000"); err != nil {
				return err
			}
			note, err := rt.prepareCrun(ctx, tmp, func(ctx context.Context) error {
				if id != "" {
					_ = rt.delete(ctx, id)
				}
				id = rt.newID()
				if err := rt.run(ctx, bundle, id, true); err != nil {
					return err
				}
				return rt.exec(ctx, id, "/bin/true")
			})
			p.note = note
			return err
		}
		p.iter = ociExecIter(rt, &id)
		p.teardown = func() {
			if id != "" {
				_ = rt.delete(context.Background(), id)
			}
			rt.unmountHugetlb()
		}
		peers = append(peers, p)
	}
	if have("runc") {
		rt := newOCIRuntime("runc", tmp)
		var id string
		peers = append(peers, &peer{
			system: "runc exec",
			setup: func(ctx context.Context) error {
				if err := writeBundle(ctx, bundle, rootfs, "/bin/sleep", "1000000"); err != nil {
					return err
				}
				id = rt.newID()
				if err := rt.run(ctx, bundle, id, true); err != nil {
					return err
				}
				return rt.exec(ctx, id, "/bin/true")
			},
			iter: ociExecIter(rt, &id),
			teardown: func() {
				if id != "" {
					_ = rt.delete(context.Background(), id)
				}
			},
		})
	}
	if have("nsenter") {
		var args []string
		peers = append(peers, &peer{
			system: "nsenter",
			note:   "nsenter -t <sandbox init> -m -u -i -n -p -r -w /bin/true: joins the Warren sandbox's namespaces and root, not its cgroup",
			setup: func(ctx context.Context) error {
				pid, err := initPid()
				if err != nil {
					return err
				}
				args = []string{"-t", strconv.Itoa(pid), "-m", "-u", "-i", "-n", "-p", "-r", "-w", "/bin/true"}
				return runCmd(ctx, "nsenter", args...)
			},
			iter: func(ctx context.Context, _ int) ([]time.Duration, error) {
				t0 := time.Now()
				if err := runCmd(ctx, "nsenter", args...); err != nil {
					return nil, err
				}
				return []time.Duration{time.Since(t0)}, nil
			},
			teardown: func() {},
		})
	}
	return peers
}

func ociExecIter(rt *ociRuntime, id *string) Iteration {
	return func(ctx context.Context, _ int) ([]time.Duration, error) {
		t0 := time.Now()
		if err := rt.exec(ctx, *id, "/bin/true"); err != nil {
			return nil, err
		}
		return []time.Duration{time.Since(t0)}, nil
	}
}
