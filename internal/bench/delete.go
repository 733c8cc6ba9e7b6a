package bench

import (
	"context"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"time"

	warrenv1 "github.com/warrenrl/warren/gen/warren/v1"
)

// DeleteConfig configures `warren bench delete`.
type DeleteConfig struct {
	Rounds   int // deletes timed per case
	Files    int // files the "wrote files" sandbox creates
	DirtyMiB int // unwritten data another sandbox holds in the "neighbour" case
	Peers    bool
}

// DeleteReport is the result of `warren bench delete`.
type DeleteReport struct {
	Benchmark string      `json:"benchmark"`
	Daemon    string      `json:"daemon"`
	Files     int         `json:"files"`
	DirtyMiB  int         `json:"dirty_mib"`
	Results   []DeleteRow `json:"results"`
	Notes     []string    `json:"notes,omitempty"`
}

// DeleteRow is one case: how long Delete (or the peer) took.
type DeleteRow struct {
	Case   string  `json:"case"`
	System string  `json:"system"`
	N      int     `json:"n"`
	P50Ms  float64 `json:"p50_ms"`
	MinMs  float64 `json:"min_ms"`
	MaxMs  float64 `json:"max_ms"`
}

// RunDelete times Delete of a sandbox in three cases: idle, after it wrote
// cfg.Files files, and idle while another sandbox holds cfg.DirtyMiB of
// unwritten data. The peer is `rm -rf` of the same tree on the same
// filesystem: what removing the writable layer costs when done in line.
func RunDelete(ctx context.Context, env *Env, cfg DeleteConfig) (*DeleteReport, error) {
	rep := &DeleteReport{Benchmark: "delete", Daemon: env.describe(), Files: cfg.Files, DirtyMiB: cfg.DirtyMiB}
	rep.Notes = append(rep.Notes,
		"warren: the Delete call through the client SDK, from request to reply",
		fmt.Sprintf("wrote files: the sandbox first made %d files of 2 bytes in 100 directories (busybox sh)", cfg.Files),
		fmt.Sprintf("neighbour: another sandbox first wrote %d MiB with dd and did not sync; the deleted sandbox is idle", cfg.DirtyMiB))
	create := func(memBytes int64) (string, error) {
		req := env.CreateRequest()
		if memBytes > 0 {
			req.Resources = &warrenv1.Resources{MemoryBytes: memBytes}
		}
		sb, err := env.Client.Create(ctx, req)
		if err != nil {
			return "", fmt.Errorf("create sandbox: %w", err)
		}
		return sb.GetId(), nil
	}
	sh := func(id, script string) error {
		res, err := env.Client.Exec(ctx, &warrenv1.ExecRequest{SandboxId: id, Argv: []string{"sh", "-c", script}, TimeoutMs: 600_000})
		if err != nil {
			return err
		}
		if res.GetExitCode() != 0 {
			return fmt.Errorf("%q: exit %d: %s", script, res.GetExitCode(), res.GetStderr())
		}
		return nil
	}
	timeDelete := func(id string) (time.Duration, error) {
		t0 := time.Now()
		err := env.Client.Delete(ctx, id)
		return time.Since(t0), err
	}
	perDir := max(cfg.Files/100, 1)
	writeFiles := fmt.Sprintf("mkdir -p /work && cd /work && for d in $(seq 100); do mkdir $d; for f in $(seq %d); do echo x > $d/$f; done; done", perDir)

	cases := []struct {
		name string
		run  func() (time.Duration, error)
	}{
		{"idle", func() (time.Duration, error) {
			id, err := create(0)
			if err != nil {
				return 0, err
			}
			return timeDelete(id)
		}},
		{"wrote files", func() (time.Duration, error) {
			id, err := create(0)
			if err != nil {
				return 0, err
			}
			if err := sh(id, writeFiles); err != nil {
				_ = env.Client.Delete(ctx, id)
				return 0, err
			}
			return timeDelete(id)
		}},
		{"neighbour", func() (time.Duration, error) {
			a, err := create(int64(cfg.DirtyMiB+256) << 20)
			if err != nil {
				return 0, err
			}
			defer func() { _ = env.Client.Delete(context.WithoutCancel(ctx), a) }()
			b, err := create(0)
			if err != nil {
				return 0, err
			}
			if err := sh(a, fmt.Sprintf("dd if=/dev/zero of=/big bs=1M count=%d 2>/dev/null", cfg.DirtyMiB)); err != nil {
				_ = env.Client.Delete(ctx, b)
				return 0, err
			}
			return timeDelete(b)
		}},
	}
	for _, c := range cases {
		env.logf("delete: %s, %d rounds", c.name, cfg.Rounds)
		var ds []time.Duration
		for range cfg.Rounds {
			d, err := c.run()
			if err != nil {
				return nil, fmt.Errorf("delete, %s: %w", c.name, err)
			}
			ds = append(ds, d)
		}
		rep.Results = append(rep.Results, deleteRow(c.name, "warren", ds))
	}
	if cfg.Peers {
		env.logf("delete: rm -rf of the same tree, %d rounds", cfg.Rounds)
		var ds []time.Duration
		for i := range cfg.Rounds {
			dir := filepath.Join(env.Tmp, "rmtree-"+strconv.Itoa(i))
			if err := makeTree(dir, 100, perDir); err != nil {
				return nil, err
			}
			t0 := time.Now()
			err := os.RemoveAll(dir)
			ds = append(ds, time.Since(t0))
			if err != nil {
				return nil, err
			}
		}
		rep.Results = append(rep.Results, deleteRow("wrote files", "rm -rf", ds))
		rep.Notes = append(rep.Notes, "rm -rf: os.RemoveAll of the same tree made by the benchmark on the filesystem of the daemon's state directory (the benchmark's scratch directory for a private daemon): the removal a delete would wait for if done in line")
	}
	return rep, nil
}

func makeTree(dir string, dirs, files int) error {
	for d := range dirs {
		sub := filepath.Join(dir, strconv.Itoa(d))
		if err := os.MkdirAll(sub, 0o755); err != nil {
			return err
		}
		for f := range files {
			if err := os.WriteFile(filepath.Join(sub, strconv.Itoa(f)), []byte("x\n"), 0o644); err != nil {
				return err
			}
		}
	}
	return nil
}

func deleteRow(name, system string, ds []time.Duration) DeleteRow {
	v := make([]float64, len(ds))
	for i, d := range ds {
		v[i] = float64(d.Microseconds()) / 1000
	}
	slices.Sort(v)
	return DeleteRow{Case: name, System: system, N: len(v), P50Ms: round(Percentile(v, 50), 2), MinMs: round(v[0], 2), MaxMs: round(v[len(v)-1], 2)}
}

// Table prints the delete report.
func (r *DeleteReport) Table(w io.Writer) error {
	fmt.Fprintf(w, "delete latency (daemon: %s; %d files; neighbour with %d MiB unwritten)\n\n", r.Daemon, r.Files, r.DirtyMiB)
	t := newTable("CASE", "SYSTEM", "N", "P50 ms", "MIN ms", "MAX ms")
	for _, row := range r.Results {
		t.add(row.Case, row.System, strconv.Itoa(row.N), ms(row.P50Ms), ms(row.MinMs), ms(row.MaxMs))
	}
	if err := t.write(w); err != nil {
		return err
	}
	fmt.Fprintln(w)
	writeNotes(w, r.Notes)
	return nil
}
