package metrics

import (
	"archive/tar"
	"bytes"
	"context"
	"io"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/warrenrl/warren/internal/image"
	"github.com/warrenrl/warren/internal/testutil"
)

// The layer metrics of a real store: a layer mounted and read shows its
// size and the bytes read.
func TestLayerMetrics(t *testing.T) {
	testutil.RequireRoot(t)
	dir := t.TempDir()
	s, err := image.OpenStore(image.Options{Root: filepath.Join(dir, "images"), MountDir: filepath.Join(dir, "mnt"), MountGrace: -1, GCGrace: -1, NodeID: "n1"})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		s.Close()
		s.Mounts().UnmountAll()
	})
	body := bytes.Repeat([]byte("0123456789abcdef"), 64<<10) // 1 MiB
	var tb bytes.Buffer
	tw := tar.NewWriter(&tb)
	tw.WriteHeader(&tar.Header{Name: "data", Mode: 0o644, Size: int64(len(body)), Typeflag: tar.TypeReg})
	tw.Write(body)
	tw.Close()
	ctx := context.Background()
	img, err := s.ImportTar(ctx, "img", &tb)
	if err != nil {
		t.Fatal(err)
	}

	m := New()
	m.RegisterLayers(func(ctx context.Context) ([]LayerSample, error) {
		st, err := s.MountedStats(ctx)
		var out []LayerSample
		for _, x := range st {
			out = append(out, LayerSample{Digest: x.Digest, Size: x.Size, Resident: x.Resident, BlobResident: x.BlobResident,
				FilesResident: x.FilesResident, Refs: x.Refs, DirectIO: x.DirectIO})
		}
		return out, err
	}, time.Nanosecond)
	scrape := func() string {
		srv := httptest.NewServer(m.Handler())
		defer srv.Close()
		res, err := srv.Client().Get(srv.URL)
		if err != nil {
			t.Fatal(err)
		}
		defer res.Body.Close()
		b, _ := io.ReadAll(res.Body)
		return string(b)
	}
	if out := scrape(); strings.Contains(out, "warren_layer_size_bytes{") {
		t.Fatalf("layer metrics before any mount:\n%s", out)
	}

	dirs, release, err := s.LayerDirs(ctx, img)
	if err != nil {
		t.Fatal(err)
	}
	defer release()
	if b, err := os.ReadFile(filepath.Join(dirs[0], "data")); err != nil || !bytes.Equal(b, body) {
		t.Fatal(err)
	}
	d := img.Layers[0]
	out := scrape()
	get := func(name string) int64 {
		t.Helper()
		prefix := name + `{layer="` + d + `"} `
		for _, l := range strings.Split(out, "\n") {
			if v, ok := strings.CutPrefix(l, prefix); ok {
				f, err := strconv.ParseFloat(v, 64)
				if err != nil {
					t.Fatal(err)
				}
				return int64(f)
			}
		}
		t.Fatalf("no %s for %s in:\n%s", name, d, out)
		return 0
	}
	size, read := get("warren_layer_size_bytes"), get("warren_layer_read_bytes")
	if size < int64(len(body)) || read < int64(len(body)) || read > size || get("warren_layer_sandboxes") != 1 {
		t.Fatalf("size %d read %d:\n%s", size, read, out)
	}
	if get("warren_layer_files_cached_bytes") < int64(len(body)) {
		t.Fatalf("files cache:\n%s", out)
	}
	get("warren_layer_direct_io")
	get("warren_layer_blob_cached_bytes")
}
