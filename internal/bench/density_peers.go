package bench

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"sync"
	"time"
)

// densityPeer is N idle instances of a peer, measured like the sandboxes.
type densityPeer struct {
	system, note string
	setup        func(ctx context.Context) error
	start        func(ctx context.Context, i int) error
	// ready reports whether all started instances run their sleep.
	ready func() bool
	// pids returns every process of every instance.
	pids     func() []int
	stopAll  func(ctx context.Context) error
	teardown func()
}

func densityPeers(ctx context.Context, env *Env, cfg DensityConfig) []DensityPeerRow {
	var rows []DensityPeerRow
	for _, p := range idlePeers(env.Tmp, env.Rootfs, cfg.N, cfg.Concurrency) {
		rows = append(rows, measureDensityPeer(ctx, env, p, cfg.N, cfg.Concurrency))
		if ctx.Err() != nil {
			break
		}
	}
	return rows
}

func measureDensityPeer(ctx context.Context, env *Env, p *densityPeer, n, conc int) (row DensityPeerRow) {
	row = DensityPeerRow{System: p.system, N: n}
	env.logf("density peer %s: setting up", p.system)
	err := p.setup(ctx)
	defer func() { row.Note = p.note }()
	if p.teardown != nil {
		defer p.teardown()
	}
	if err != nil {
		row.Error = "setup: " + err.Error()
		return row
	}
	before, err := settledMemAvailable()
	if err != nil {
		row.Error = err.Error()
		return row
	}
	miBefore, _ := readMeminfo()
	slabBefore := readSlabinfo()
	env.logf("density peer %s: starting %d", p.system, n)
	var (
		next int
		mu   sync.Mutex
	)
	start := time.Now()
	r := Loop(ctx, n, 0, conc, 0, func(ctx context.Context, _ int) ([]time.Duration, error) {
		mu.Lock()
		i := next
		next++
		mu.Unlock()
		return nil, p.start(ctx, i)
	})
	// The instance runs once its sleep does.
	for deadline := time.Now().Add(2 * time.Minute); !p.ready() && time.Now().Before(deadline); {
		time.Sleep(50 * time.Millisecond)
	}
	row.CreateS = round(time.Since(start).Seconds(), 3)
	defer func() {
		t0 := time.Now()
		if err := p.stopAll(context.WithoutCancel(ctx)); err != nil && row.Error == "" {
			row.Error = "stop: " + err.Error()
		}
		row.DeleteS = round(time.Since(t0).Seconds(), 3)
		if deleted, err := settledMemAvailable(); err == nil {
			row.NodeKiBNotBack = float64(before - deleted)
		}
	}()
	if r.FirstErr != nil {
		row.Error = fmt.Sprintf("%d of %d failed to start; first: %v", r.Errors, n, r.FirstErr)
	}
	if r.Done == 0 {
		return row
	}
	pss, _ := sumPss(p.pids())
	row.PssKiB = round(float64(pss)/float64(r.Done), 1)
	after, err := settledMemAvailable()
	if err != nil {
		row.Error = err.Error()
		return row
	}
	row.NodeKiBPerSandbox = round(float64(before-after)/float64(r.Done), 1)
	row.MeminfoKiBPerSandbox = meminfoDeltas(miBefore, float64(r.Done))
	row.AccountedKiBPerSandbox = accounted(row.MeminfoKiBPerSandbox)
	row.SlabKiBPerSandbox = topSlabDeltas(slabBefore, readSlabinfo(), float64(r.Done), 8)
	row.N = r.Done
	return row
}

// idlePeers: N `unshare ... chroot ROOTFS sleep` processes, and N detached
// crun containers running sleep.
func idlePeers(tmp, rootfs string, n, conc int) []*densityPeer {
	var peers []*densityPeer
	if have("unshare") && have("chroot") {
		var (
			mu   sync.Mutex
			cmds = make([]*exec.Cmd, n)
		)
		unsharePids := func() []int {
			mu.Lock()
			defer mu.Unlock()
			var out []int
			for _, c := range cmds {
				if c != nil && c.Process != nil {
					out = append(out, c.Process.Pid)
				}
			}
			return out
		}
		sleepers := func() []int {
			kids, _ := childrenOf(unsharePids()...)
			return kids
		}
		peers = append(peers, &densityPeer{
			system: "unshare+chroot sleep",
			note:   "unshare --mount --pid --fork --uts --ipc --net --kill-child chroot ROOTFS /bin/sleep: an unshare parent and the sleep per instance; no cgroup, no mounts",
			setup:  func(context.Context) error { return nil },
			start: func(ctx context.Context, i int) error {
				args := append([]string{"--kill-child"}, unshareArgs(rootfs, "/bin/sleep", "1000000")...)
				c := exec.Command("unshare", args...)
				if err := c.Start(); err != nil {
					return err
				}
				mu.Lock()
				cmds[i] = c
				mu.Unlock()
				return nil
			},
			ready: func() bool { return len(sleepers()) >= len(unsharePids()) },
			pids:  func() []int { return append(unsharePids(), sleepers()...) },
			stopAll: func(ctx context.Context) error {
				mu.Lock()
				defer mu.Unlock()
				for _, c := range cmds {
					if c != nil && c.Process != nil {
						_ = c.Process.Kill()
					}
				}
				for i, c := range cmds {
					if c != nil && c.Process != nil {
						_ = c.Wait()
					}
					cmds[i] = nil
				}
				return nil
			},
		})
	}
	if have("crun") {
		rt := newOCIRuntime("crun", tmp)
		bundle := filepath.Join(tmp, "bundle-idle")
		ids := make([]string, n)
		p := &densityPeer{system: "crun --detach sleep"}
		containerPids := func() []int {
			var out []int
			for _, id := range ids {
				if id == "" {
					continue
				}
				b, err := os.ReadFile(filepath.Join(rt.root, id, "status"))
				if err != nil {
					continue
				}
				var st struct {
					Pid int `json:"pid"`
				}
				if json.Unmarshal(b, &st) == nil && st.Pid > 0 {
					out = append(out, st.Pid)
				}
			}
			return out
		}
		p.setup = func(ctx context.Context) error {
			if err := writeBundle(ctx, bundle, rootfs, "/bin/sleep", "1000000"); err != nil {
				return err
			}
			note, err := rt.prepareCrun(ctx, tmp, func(ctx context.Context) error {
				id := rt.newID()
				err := rt.run(ctx, bundle, id, true)
				_ = rt.delete(ctx, id)
				return err
			})
			p.note = "crun run --detach of /bin/sleep (no monitor process; per-container cgroups); " + note
			return err
		}
		p.start = func(ctx context.Context, i int) error {
			id := rt.newID()
			if err := rt.run(ctx, bundle, id, true); err != nil {
				return err
			}
			ids[i] = id
			return nil
		}
		p.ready = func() bool { return true } // run --detach returns once the process runs
		p.pids = containerPids
		p.stopAll = func(ctx context.Context) error {
			var todo []string
			for _, id := range ids {
				if id != "" {
					todo = append(todo, id)
				}
			}
			var wg sync.WaitGroup
			ch := make(chan string)
			for w := 0; w < conc; w++ {
				wg.Add(1)
				go func() {
					defer wg.Done()
					for id := range ch {
						_ = rt.delete(ctx, id)
					}
				}()
			}
			for _, id := range todo {
				ch <- id
			}
			close(ch)
			wg.Wait()
			return nil
		}
		p.teardown = rt.unmountHugetlb
		peers = append(peers, p)
	}
	return peers
}
