package bench

import (
	"bytes"
	"context"
	_ "embed"
	"encoding/json"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"time"
)

//go:embed e2b.py
var e2bDriver []byte

// E2BConfig configures RunE2B.
type E2BConfig struct {
	N, Warmup int
	// URL and Key reach the daemon's E2B door (--e2b-addr, a key of
	// --e2b-api-key-file).
	URL, Key string
	// Python has both the `e2b` and the `warren` package; "" makes a
	// venv in the run's scratch directory with E2BRequirement and the
	// Warren SDK at WarrenSDK installed from them.
	Python, E2BRequirement, WarrenSDK string
}

// E2BReport compares one create + `true` + kill cycle through the E2B
// Python SDK (Warren's E2B door) with the same through Warren's own
// Python SDK, interleaved in the same run.
type E2BReport struct {
	Benchmark string   `json:"benchmark"`
	SDK       string   `json:"e2b_sdk"`
	E2B       Summary  `json:"e2b"`
	Warren    Summary  `json:"warren"`
	RatioP50  *float64 `json:"ratio_p50"`
	RatioMean *float64 `json:"ratio_mean"`
	Notes     []string `json:"notes"`
}

// Table prints the two rows and the ratio.
func (r E2BReport) Table(w io.Writer) error {
	t := newTable("client", "n", "p50", "p99", "mean")
	t.add("E2B SDK "+r.SDK+" -> --e2b-addr", strconv.Itoa(r.E2B.N), ms(r.E2B.P50), ms(r.E2B.P99), ms(r.E2B.Mean))
	t.add("Warren Python SDK -> socket", strconv.Itoa(r.Warren.N), ms(r.Warren.P50), ms(r.Warren.P99), ms(r.Warren.Mean))
	if err := t.write(w); err != nil {
		return err
	}
	fmt.Fprintf(w, "E2B/Warren: p50 %s, mean %s (target <= 1.3)\n", ratioStr(r.RatioP50), ratioStr(r.RatioMean))
	writeNotes(w, r.Notes)
	return nil
}

// RunE2B runs the driver (e2b.py) and summarizes what it measured.
func RunE2B(ctx context.Context, env *Env, cfg E2BConfig) (E2BReport, error) {
	py := cfg.Python
	if py == "" {
		venv := filepath.Join(env.Tmp, "e2b-venv")
		env.logf("making a venv with %s and the Warren SDK (%s)", cfg.E2BRequirement, cfg.WarrenSDK)
		if out, err := exec.CommandContext(ctx, "python3", "-m", "venv", venv).CombinedOutput(); err != nil {
			return E2BReport{}, fmt.Errorf("python3 -m venv: %w: %s", err, out)
		}
		py = filepath.Join(venv, "bin", "python")
		if out, err := exec.CommandContext(ctx, py, "-m", "pip", "install", "-q", "--disable-pip-version-check", cfg.E2BRequirement, cfg.WarrenSDK).CombinedOutput(); err != nil {
			return E2BReport{}, fmt.Errorf("pip install %s %s: %w: %s", cfg.E2BRequirement, cfg.WarrenSDK, err, out)
		}
	}
	script := filepath.Join(env.Tmp, "e2b_bench.py")
	if err := os.WriteFile(script, e2bDriver, 0o644); err != nil {
		return E2BReport{}, err
	}
	ver, _ := exec.CommandContext(ctx, py, "-c", "import importlib.metadata as m; print(m.version('e2b'), end='')").Output()
	env.logf("%d+%d interleaved cycles per SDK (e2b %s)", cfg.Warmup, cfg.N, ver)
	cmd := exec.CommandContext(ctx, py, script, strconv.Itoa(cfg.N), strconv.Itoa(cfg.Warmup), env.Image, env.Addr)
	cmd.Env = append(os.Environ(), "E2B_API_URL="+cfg.URL, "E2B_SANDBOX_URL="+cfg.URL, "E2B_API_KEY="+cfg.Key)
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	if err != nil {
		return E2BReport{}, fmt.Errorf("e2b bench driver: %w: %s", err, stderr.Bytes())
	}
	var res struct{ E2B, Warren []float64 }
	if err := json.Unmarshal(out, &res); err != nil {
		return E2BReport{}, fmt.Errorf("e2b bench driver output: %w", err)
	}
	durs := func(s []float64) []time.Duration {
		d := make([]time.Duration, len(s))
		for i, v := range s {
			d[i] = time.Duration(v * float64(time.Second))
		}
		return d
	}
	r := E2BReport{Benchmark: "e2b", SDK: string(ver), E2B: Summarize(durs(res.E2B)), Warren: Summarize(durs(res.Warren))}
	r.RatioP50, r.RatioMean = ratio(r.E2B.P50, r.Warren.P50), ratio(r.E2B.Mean, r.Warren.Mean)
	r.Notes = []string{
		"one cycle: create from the busybox image, run `true`, kill/delete; the two SDKs alternate, first one then the other, round by round",
		"E2B: REST and envd over loopback TCP (envd Start = a stat of /bin/bash, StartProcess, closing stdin, AttachProcess); Warren: its Connect API over the unix socket (Create, Exec, Delete)",
	}
	return r, nil
}
