package bench

import (
	"context"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"time"

	"golang.org/x/sys/unix"

	"github.com/warrenrl/warren/client"
	warrenv1 "github.com/warrenrl/warren/gen/warren/v1"
	"github.com/warrenrl/warren/internal/image"
)

// OndemandConfig configures `warren bench ondemand`.
type OndemandConfig struct {
	// Image is an image the user named (--image); "" picks "default" or
	// "debian" of the daemon, or builds Debian with debootstrap.
	Image string
	// Busybox uses the busybox image instead of Debian (no debootstrap).
	Busybox bool
	SizeMB  int // synthetic workspace + toolkit stacked on the image
	Runs    int // cold starts per system
}

// OndemandReport is the result of `warren bench ondemand`.
type OndemandReport struct {
	Benchmark   string    `json:"benchmark"`
	Daemon      string    `json:"daemon"`
	Image       string    `json:"image"`
	ImageSource string    `json:"image_source"`
	ImageBuildS float64   `json:"image_build_s,omitempty"`
	Layers      []string  `json:"layers"`
	Content     SynthInfo `json:"content"`

	// Per layer (image layers bottom first, then the named layers): the
	// bytes of its blob whose content is in the page cache after one
	// sandbox ran the tool calls, caches dropped before (ImageStats
	// resident: the blob's own cache and the mounted files' cache, each
	// block once).
	LayerStats []OndemandLayer `json:"layer_stats"`
	// The image's layers together, and everything together.
	ImageTouchedFraction *float64 `json:"image_touched_fraction"`
	AllTouchedFraction   *float64 `json:"all_touched_fraction"`
	ImageBytes           int64    `json:"image_bytes"`
	ImageResident        int64    `json:"image_resident"`
	AllBytes             int64    `json:"all_bytes"`
	AllResident          int64    `json:"all_resident"`
	// The measure of earlier versions, the blob files' own page cache
	// only: equal to the above when mounts read through the page cache,
	// metadata only with direct I/O.
	ImageBlobTouchedFraction *float64 `json:"image_blob_touched_fraction"`
	AllBlobResident          int64    `json:"all_blob_resident"`
	// How the layers were mounted (of the image's first layer).
	DirectIO    bool `json:"direct_io"`
	ReadAheadKB int  `json:"layer_read_ahead_kb,omitempty"`
	// Bytes read from the scratch disk holding the store (/proc/diskstats)
	// from the create to the last tool call: a count of reads independent
	// of the page cache, to check all_resident against.
	DiskReadBytes *int64   `json:"disk_read_bytes,omitempty"`
	DiskDevice    string   `json:"disk_device,omitempty"`
	DiskReadRatio *float64 `json:"disk_read_over_all_resident,omitempty"`
	ToolCalls     []Step   `json:"tool_calls"`
	ToolCallsMs   float64  `json:"tool_calls_ms"`

	// Start: create to the first exec result, page cache dropped before
	// each run. Run 1 also mounts the layers; later runs find the mounts
	// cached (kept 60 s after their last user).
	WarrenStartMs       []float64 `json:"warren_start_ms"`
	WarrenStartMedianMs float64   `json:"warren_start_median_ms"`
	// The alternative: copy the flattened tree (image + layers) to a new
	// directory with cp -a, then start the first command in it with
	// unshare+chroot (namespaces only: cheaper than any sandbox).
	Copy OndemandCopy `json:"copy_then_start"`
	// Copy total median / Warren start median.
	StartSpeedup *float64 `json:"start_speedup"`
	Notes        []string `json:"notes,omitempty"`
}

// OndemandLayer is one layer's residency.
type OndemandLayer struct {
	Owner           string   `json:"owner"`
	Digest          string   `json:"digest"`
	Format          string   `json:"format"`
	Size            int64    `json:"size"`
	Files           int64    `json:"files"`
	ResidentBefore  int64    `json:"resident_before"`
	Resident        int64    `json:"resident"`
	TouchedFraction *float64 `json:"touched_fraction"`
	// The two caches Resident is made of (a block may be in both).
	BlobResident        int64    `json:"blob_resident"`
	FilesResident       int64    `json:"files_resident"`
	BlobTouchedFraction *float64 `json:"blob_touched_fraction"`
	DirectIO            bool     `json:"direct_io"`
	ReadAheadKB         int      `json:"read_ahead_kb,omitempty"`
}

// Step is the duration of one tool call.
type Step struct {
	Name string  `json:"name"`
	Ms   float64 `json:"ms"`
}

// OndemandCopy is the copy-then-start alternative.
type OndemandCopy struct {
	TreeBytes    int64     `json:"tree_bytes"`
	TreeFiles    int       `json:"tree_files"`
	CopyMs       []float64 `json:"copy_ms"`
	StartMs      []float64 `json:"start_ms"`
	TotalMs      []float64 `json:"total_ms"`
	TotalMedian  float64   `json:"total_median_ms"`
	SyncMs       []float64 `json:"sync_after_ms"`
	BytesWritten []int64   `json:"bytes_written"`
	Device       string    `json:"device,omitempty"`
	Error        string    `json:"error,omitempty"`
}

// RunOndemand measures how much of an image one agent session reads and
// how fast a sandbox starts on a cold page cache, against copying the
// image's tree first.
func RunOndemand(ctx context.Context, env *Env, cfg OndemandConfig) (*OndemandReport, error) {
	if cfg.Runs < 1 {
		cfg.Runs = 3
	}
	rep := &OndemandReport{Benchmark: "ondemand", Daemon: env.describe()}
	img, src, buildS, cleanup, err := ondemandImage(ctx, env, cfg)
	if err != nil {
		return nil, err
	}
	defer cleanup()
	rep.Image, rep.ImageSource, rep.ImageBuildS = img, src, buildS

	syn, info, err := env.synth(ctx, cfg.SizeMB, false)
	if err != nil {
		return nil, err
	}
	rep.Content = info
	ws, tk := layerNames()
	defer env.removeLayers(ws, tk)
	env.logf("ondemand: building layers %s and %s", ws, tk)
	if err := env.buildLayer(ctx, ws, syn.WorkspaceDir); err != nil {
		return nil, err
	}
	if err := env.buildLayer(ctx, tk, syn.ToolkitDir); err != nil {
		return nil, err
	}
	rep.Layers = []string{ws, tk}
	req := env.CreateRequest()
	req.Image, req.Layers = img, []string{ws, tk}
	names := []string{img, "layer:" + ws, "layer:" + tk}

	// 1. One sandbox runs the tool calls on a cold page cache.
	if err := dropCaches(); err != nil {
		return nil, fmt.Errorf("drop caches (needs root): %w", err)
	}
	before, err := env.Client.ImageStats(ctx, names...)
	if err != nil {
		return nil, fmt.Errorf("image stats: %w", err)
	}
	// Again: a stats call of a mounted layer walks its tree, which
	// leaves its dentries and inodes cached.
	if err := dropCaches(); err != nil {
		return nil, err
	}
	disk, diskErr := deviceOf(env.DiskDir())
	var read0 int64
	if diskErr == nil {
		read0, diskErr = sectorsRead(disk)
	}
	env.logf("ondemand: one sandbox of %s + %s + %s runs %d tool calls (page cache dropped)", img, ws, tk, len(toolCalls))
	t0 := time.Now()
	sb, err := env.Client.Create(ctx, req)
	if err != nil {
		return nil, fmt.Errorf("create: %w", err)
	}
	first, err := runToolCalls(ctx, env.Client, sb.GetId(), toolCalls[:1])
	start := time.Since(t0)
	var rest seqResult
	if err == nil {
		rest, err = runToolCalls(ctx, env.Client, sb.GetId(), toolCalls[1:])
	}
	if err != nil {
		_ = env.Client.Delete(context.WithoutCancel(ctx), sb.GetId())
		return nil, err
	}
	if diskErr == nil && env.diskDir != "" { // only the benchmark uses the scratch disk
		if read1, err := sectorsRead(disk); err == nil {
			n := (read1 - read0) * 512
			rep.DiskReadBytes, rep.DiskDevice = &n, disk.Name
		}
	}
	after, err := env.Client.ImageStats(ctx, names...)
	if err != nil {
		return nil, fmt.Errorf("image stats: %w", err)
	}
	if err := env.Client.Delete(ctx, sb.GetId()); err != nil {
		return nil, fmt.Errorf("delete: %w", err)
	}
	rep.WarrenStartMs = append(rep.WarrenStartMs, round(msOf(start), 1))
	for i, d := range append(first.Steps, rest.Steps...) {
		rep.ToolCalls = append(rep.ToolCalls, Step{Name: toolCalls[i].Name, Ms: round(msOf(d), 1)})
	}
	rep.ToolCallsMs = round(msOf(first.Total+rest.Total), 1)
	rep.layerStats(img, before, after)
	if rep.DiskReadBytes != nil {
		rep.DiskReadRatio = ratio4(float64(*rep.DiskReadBytes), float64(rep.AllResident))
	}

	// 2. More cold starts.
	for i := 1; i < cfg.Runs; i++ {
		d, err := warrenColdStart(ctx, env, req)
		if err != nil {
			return nil, err
		}
		rep.WarrenStartMs = append(rep.WarrenStartMs, round(msOf(d), 1))
	}
	rep.WarrenStartMedianMs = median(rep.WarrenStartMs)

	// 3. Copy the flattened tree, then start.
	rep.Copy = copyThenStart(ctx, env, req, cfg.Runs)
	rep.StartSpeedup = ratio(rep.Copy.TotalMedian, rep.WarrenStartMedianMs)

	io := "buffered: EROFS reads each blob through the blob file's page cache, with the store disk's readahead"
	if rep.DirectIO {
		io = "direct I/O: EROFS reads each blob with O_DIRECT, so only the blocks it asks for, and caches them in the layer's files only"
	}
	ra := "unknown"
	if rep.ReadAheadKB > 0 {
		ra = strconv.Itoa(rep.ReadAheadKB) + " KiB"
	}
	rep.Notes = append(rep.Notes,
		"touched_fraction: bytes of the layer's EROFS blob whose content is in the page cache after the tool calls (ImageStats resident), over the blob size; sync + drop_caches before the sandbox was created, so it is what the sandbox (and the kernel's readahead) read. A block counts once whether it is cached in the blob file itself (blob_resident, mincore: EROFS metadata, and everything with buffered mounts) or in the mounted layer's files and directories (files_resident, cachestat/mincore of every file, mapped back to blob blocks with FIEMAP); the metadata the stats walk itself reads is dropped again",
		"blob_touched_fraction: the blob file's own page cache only (the measure before direct I/O mounts; with them it misses the data)",
		"layer mounts: "+io+"; readahead of the layer's files "+ra+" (the mount's own bdi)",
		"disk_read_bytes: sectors read from the scratch disk holding the store (/proc/diskstats) from the create to the last tool call: the blobs' reads plus the scratch ext4's own metadata and the state database; it does not depend on the page cache",
		"warren start: create (image + 2 named layers) to the first exec result ("+strconv.Quote(toolCalls[0].Shell)+"), drop_caches before each run; run 1 includes mounting the layers, later runs reuse the cached mounts",
		"copy_then_start: the flattened tree (image + layers, taken once from a sandbox with the archive endpoint) is copied with cp -a to a new directory on the same disk after drop_caches, then the same first command runs in it under unshare --mount --pid --fork --uts --ipc --net chroot (no cgroup, no overlay: cheaper than any sandbox start); cp does not fsync, the sync after it is reported separately and not in the total")
	if ra := readAheadKB(env); ra != "" {
		rep.Notes = append(rep.Notes, "read_ahead_kb of the disk holding the blobs: "+ra+" (with buffered layer mounts, this readahead on the blob files makes the kernel read more than the files touched)")
	}
	return rep, nil
}

func msOf(d time.Duration) float64 { return float64(d) / float64(time.Millisecond) }

func median(v []float64) float64 {
	s := slices.Clone(v)
	slices.Sort(s)
	return round(Percentile(s, 50), 1)
}

// ondemandImage picks or builds the image: --image, --busybox, the
// daemon's "default" or "debian", or Debian built with debootstrap.
func ondemandImage(ctx context.Context, env *Env, cfg OndemandConfig) (name, source string, buildS float64, cleanup func(), err error) {
	cleanup = func() {}
	switch {
	case cfg.Image != "":
		return env.Image, "given (--image)", 0, cleanup, nil
	case cfg.Busybox:
		return env.Image, "busybox (--busybox)", 0, cleanup, nil
	}
	imgs, err := env.Client.ListImages(ctx)
	if err != nil {
		return "", "", 0, cleanup, err
	}
	for _, want := range []string{"default", "debian"} {
		for _, im := range imgs {
			if im.GetName() == want {
				return want, "existing image " + want + " of the daemon", 0, cleanup, nil
			}
		}
	}
	dir := filepath.Join(env.Tmp, "debian")
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return "", "", 0, cleanup, err
	}
	rootfs := filepath.Join(dir, "rootfs")
	env.logf("ondemand: building Debian %s with python3 and git (debootstrap; takes a minute or two)", image.DebianSuite)
	t0 := time.Now()
	if err := image.BuildDebian(ctx, rootfs, env.progress); err != nil {
		return "", "", 0, cleanup, fmt.Errorf("build debian image (pass --busybox when debootstrap cannot run here): %w", err)
	}
	name = "warren-bench-debian-" + strconv.Itoa(os.Getpid())
	env.logf("ondemand: importing it as %s", name)
	if _, err := env.Client.ImportImage(ctx, name, rootfs); err != nil {
		return "", "", 0, cleanup, fmt.Errorf("import debian image: %w", err)
	}
	buildS = round(time.Since(t0).Seconds(), 1)
	_ = os.RemoveAll(dir)
	cleanup = func() {
		if env.Private {
			return
		}
		c, cancel := context.WithTimeout(context.Background(), time.Minute)
		defer cancel()
		if _, err := env.DeleteAll(c, 8); err != nil {
			env.logf("delete sandboxes: %v", err)
		}
		if err := env.Client.RemoveImage(c, name); err != nil && !client.IsNotFound(err) {
			env.logf("remove image %s: %v", name, err)
		}
	}
	return name, "built with debootstrap (Debian " + image.DebianSuite + " minbase + python3 + git)", buildS, cleanup, nil
}

// layerStats fills LayerStats and the fractions from two ImageStats.
func (r *OndemandReport) layerStats(img string, before, after []*warrenv1.LayerStat) {
	prev := map[string]int64{}
	for _, s := range before {
		prev[s.GetOwner()+"\x00"+s.GetDigest()] = s.GetResident()
	}
	var imgRes, imgBlob, imgSize, allRes, allBlob, allSize int64
	for _, s := range after {
		l := OndemandLayer{Owner: s.GetOwner(), Digest: s.GetDigest(), Format: s.GetFormat(), Size: s.GetSize(), Files: s.GetFiles(),
			ResidentBefore: prev[s.GetOwner()+"\x00"+s.GetDigest()], Resident: s.GetResident(),
			BlobResident: s.GetBlobResident(), FilesResident: s.GetFilesResident(), DirectIO: s.GetDirectIo(), ReadAheadKB: int(s.GetReadAheadKb())}
		if s.GetFormat() == "erofs" {
			l.TouchedFraction = ratio4(float64(l.Resident), float64(l.Size))
			l.BlobTouchedFraction = ratio4(float64(l.BlobResident), float64(l.Size))
			allRes += l.Resident
			allBlob += l.BlobResident
			allSize += l.Size
			if s.GetOwner() == img {
				if imgSize == 0 {
					r.DirectIO, r.ReadAheadKB = l.DirectIO, l.ReadAheadKB
				}
				imgRes += l.Resident
				imgBlob += l.BlobResident
				imgSize += l.Size
			}
		}
		r.LayerStats = append(r.LayerStats, l)
	}
	r.ImageBytes, r.ImageResident, r.AllBytes, r.AllResident, r.AllBlobResident = imgSize, imgRes, allSize, allRes, allBlob
	r.ImageTouchedFraction = ratio4(float64(imgRes), float64(imgSize))
	r.AllTouchedFraction = ratio4(float64(allRes), float64(allSize))
	r.ImageBlobTouchedFraction = ratio4(float64(imgBlob), float64(imgSize))
}

// ratio4 is a/b with 4 decimals (0 allowed for a), nil without b.
func ratio4(a, b float64) *float64 {
	if b <= 0 || a < 0 {
		return nil
	}
	v := round(a/b, 4)
	return &v
}

// warrenColdStart drops the page cache, creates a sandbox, waits for the
// first tool call's result and deletes the sandbox.
func warrenColdStart(ctx context.Context, env *Env, req *warrenv1.CreateRequest) (time.Duration, error) {
	if err := dropCaches(); err != nil {
		return 0, err
	}
	t0 := time.Now()
	sb, err := env.Client.Create(ctx, req)
	if err != nil {
		return 0, fmt.Errorf("create: %w", err)
	}
	_, err = runToolCalls(ctx, env.Client, sb.GetId(), toolCalls[:1])
	d := time.Since(t0)
	derr := env.Client.Delete(context.WithoutCancel(ctx), sb.GetId())
	return d, errors.Join(err, derr)
}

// copyThenStart measures the alternative: a full copy of the flattened
// tree, then the first command in it.
func copyThenStart(ctx context.Context, env *Env, req *warrenv1.CreateRequest, runs int) (c OndemandCopy) {
	flat := filepath.Join(env.DiskDir(), "flat")
	env.logf("ondemand: flattening the image + layers to %s (archive download of a sandbox's root)", flat)
	if err := downloadTree(ctx, env, req, flat); err != nil {
		c.Error = err.Error()
		return c
	}
	defer os.RemoveAll(flat)
	c.TreeBytes, c.TreeFiles = treeSize(flat)
	dev, derr := deviceOf(env.DiskDir())
	if derr == nil {
		c.Device = dev.Name
	}
	argv := []string{"/bin/sh", "-c", toolCallShell(toolCalls[0])}
	for i := 0; i < runs; i++ {
		dst := filepath.Join(env.DiskDir(), "copy-"+strconv.Itoa(i))
		if err := dropCaches(); err != nil {
			c.Error = err.Error()
			return c
		}
		var m *diskMeter
		if derr == nil {
			m, _ = startDiskMeter(dev, 100*time.Millisecond)
		}
		env.logf("ondemand: cp -a %s %s, then start", flat, dst)
		t0 := time.Now()
		if err := runCmd(ctx, "cp", "-a", flat, dst); err != nil {
			c.Error = err.Error()
			return c
		}
		tc := time.Since(t0)
		t1 := time.Now()
		if err := runCmd(ctx, "unshare", unshareArgs(dst, argv...)...); err != nil {
			c.Error = err.Error()
			return c
		}
		ts := time.Since(t1)
		t2 := time.Now()
		unix.Sync()
		c.SyncMs = append(c.SyncMs, round(msOf(time.Since(t2)), 1))
		if m != nil {
			b, _, _ := m.Stop()
			c.BytesWritten = append(c.BytesWritten, b)
		}
		c.CopyMs = append(c.CopyMs, round(msOf(tc), 1))
		c.StartMs = append(c.StartMs, round(msOf(ts), 1))
		c.TotalMs = append(c.TotalMs, round(msOf(tc+ts), 1))
		if err := os.RemoveAll(dst); err != nil {
			c.Error = err.Error()
			return c
		}
		unix.Sync()
	}
	c.TotalMedian = median(c.TotalMs)
	return c
}

// downloadTree extracts the root of a new sandbox of req into dir with
// the host's tar, preserving owners and modes.
func downloadTree(ctx context.Context, env *Env, req *warrenv1.CreateRequest, dir string) error {
	sb, err := env.Client.Create(ctx, req)
	if err != nil {
		return fmt.Errorf("create: %w", err)
	}
	defer func() { _ = env.Client.Delete(context.WithoutCancel(ctx), sb.GetId()) }()
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return err
	}
	rc, err := env.Client.Download(ctx, sb.GetId(), "/")
	if err != nil {
		return fmt.Errorf("download /: %w", err)
	}
	defer rc.Close()
	cmd := exec.CommandContext(ctx, "tar", "-x", "--numeric-owner", "-p", "-C", dir)
	cmd.Stdin = rc
	var stderr strings.Builder
	cmd.Stderr = &stderr
	if err := cmd.Run(); err != nil {
		return fmt.Errorf("tar -x: %v: %s", err, truncate(stderr.String(), 300))
	}
	return nil
}

// treeSize adds up the regular files below dir.
func treeSize(dir string) (int64, int) {
	var n int64
	files := 0
	_ = filepath.WalkDir(dir, func(_ string, d fs.DirEntry, err error) error {
		if err != nil {
			return nil
		}
		if d.Type().IsRegular() {
			if fi, err := d.Info(); err == nil {
				n += fi.Size()
				files++
			}
		}
		return nil
	})
	return n, files
}

// readAheadKB reads read_ahead_kb of the disk holding the state (or
// scratch) directory, "" when unknown.
func readAheadKB(env *Env) string {
	dir := env.StateDir()
	if dir == "" {
		dir = env.Tmp
	}
	dev, err := deviceOf(dir)
	if err != nil {
		return ""
	}
	if ra := devReadAheadKB(dev); ra != "" {
		return ra + " (/dev/" + dev.Name + ")"
	}
	return ""
}

// Table prints the ondemand report.
func (r *OndemandReport) Table(w io.Writer) error {
	fmt.Fprintf(w, "ondemand: one sandbox of image %s (%s) + layers %s runs %d tool calls in %.0f ms\n",
		r.Image, r.ImageSource, strings.Join(r.Layers, ", "), len(r.ToolCalls), r.ToolCallsMs)
	fmt.Fprintf(w, "daemon: %s\n\n", r.Daemon)
	t := newTable("LAYER", "DIGEST", "SIZE MiB", "FILES", "READ MiB (before)", "BLOB MiB", "FILES MiB", "TOUCHED", "BLOB ONLY")
	t.left = true
	frac := func(f *float64) string {
		if f == nil {
			return "-"
		}
		return fmt.Sprintf("%.1f%%", *f*100)
	}
	for _, l := range r.LayerStats {
		t.add(l.Owner, image.ShortDigest(l.Digest), fmt.Sprintf("%.1f", float64(l.Size)/(1<<20)), strconv.FormatInt(l.Files, 10),
			fmt.Sprintf("%.1f (%.1f)", float64(l.Resident)/(1<<20), float64(l.ResidentBefore)/(1<<20)),
			fmt.Sprintf("%.1f", float64(l.BlobResident)/(1<<20)), fmt.Sprintf("%.1f", float64(l.FilesResident)/(1<<20)),
			frac(l.TouchedFraction), frac(l.BlobTouchedFraction))
	}
	mb := func(b int64) string { return fmt.Sprintf("%.1f", float64(b)/(1<<20)) }
	t.add("= image "+r.Image+" (all its layers)", "", mb(r.ImageBytes), "", mb(r.ImageResident), "", "", frac(r.ImageTouchedFraction), frac(r.ImageBlobTouchedFraction))
	t.add("= image + named layers", "", mb(r.AllBytes), "", mb(r.AllResident), mb(r.AllBlobResident), "", frac(r.AllTouchedFraction), "")
	if err := t.write(w); err != nil {
		return err
	}
	fmt.Fprintf(w, "\nimage touched_fraction %s (target <= 10%% for a Debian+python image); layer mounts: direct_io=%v, readahead %d KiB\n", frac(r.ImageTouchedFraction), r.DirectIO, r.ReadAheadKB)
	if r.DiskReadBytes != nil {
		fmt.Fprintf(w, "read from the store's disk (/dev/%s) meanwhile: %s MiB (%s all resident)\n", r.DiskDevice, mb(*r.DiskReadBytes), ratioStr(r.DiskReadRatio))
	}
	fmt.Fprintln(w)
	st := newTable("START (to first exec result)", "RUNS ms", "MEDIAN ms")
	st.left = true
	st.add("warren create + exec, cold page cache", joinMs(r.WarrenStartMs), fmt.Sprintf("%.1f", r.WarrenStartMedianMs))
	c := r.Copy
	st.add(fmt.Sprintf("cp -a of the flattened tree (%.0f MiB, %d files)", float64(c.TreeBytes)/(1<<20), c.TreeFiles), joinMs(c.CopyMs), fmt.Sprintf("%.1f", median(c.CopyMs)))
	st.add("  + unshare+chroot start", joinMs(c.StartMs), fmt.Sprintf("%.1f", median(c.StartMs)))
	st.add("  = copy then start", joinMs(c.TotalMs), fmt.Sprintf("%.1f", c.TotalMedian))
	st.add("  (sync after the copy, not in the total)", joinMs(c.SyncMs), fmt.Sprintf("%.1f", median(c.SyncMs)))
	if err := st.write(w); err != nil {
		return err
	}
	fmt.Fprintln(w)
	if len(c.BytesWritten) > 0 {
		var parts []string
		for _, b := range c.BytesWritten {
			parts = append(parts, fmt.Sprintf("%.0f", float64(b)/(1<<20)))
		}
		fmt.Fprintf(w, "bytes written per copy (/dev/%s): %s MiB\n", c.Device, strings.Join(parts, ", "))
	}
	fmt.Fprintf(w, "start speedup (copy then start / warren cold start, medians): %s\n", ratioStr(r.StartSpeedup))
	var steps []string
	for _, s := range r.ToolCalls {
		steps = append(steps, fmt.Sprintf("%s %.0f", s.Name, s.Ms))
	}
	fmt.Fprintf(w, "tool calls (ms): %s\n\n", strings.Join(steps, ", "))
	if c.Error != "" {
		fmt.Fprintln(w, "error: copy then start: "+c.Error)
	}
	writeNotes(w, r.Notes)
	return nil
}

func joinMs(v []float64) string {
	var parts []string
	for _, x := range v {
		parts = append(parts, fmt.Sprintf("%.1f", x))
	}
	if len(parts) == 0 {
		return "-"
	}
	return strings.Join(parts, ", ")
}
