package container

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"
	"context"
	"fmt"

	"github.com/warrenrl/warren/internal/backend"
	"github.com/warrenrl/warren/internal/testutil"
)

func TestZZEagerRestoreTiming(t *testing.T) {
	requireCRIU(t)
	for _, userns := range []bool{false, true} {
		opts := testOptions(t, fmt.Sprintf("zz%v-", userns))
		b, err := New(opts)
		if err != nil { t.Fatal(err) }
		layers := backend.DirLayers(testutil.BusyboxRoot(t))
		id := fmt.Sprintf("zsrc%v", userns)
		sb, err := b.Create(t.Context(), backend.Spec{ID: id, Layers: layers, MemoryBytes: 1 << 30, UserNS: userns})
		if err != nil { t.Fatal(err) }
		if _, err := sb.(backend.Background).StartBackground(t.Context(), backend.ProcSpec{Argv: []string{"sh", "-c", `x=$(head -c 190000000 /dev/zero | tr '\0' a); echo ok > /tmp/s1; sleep 100000`}}, backend.BackgroundOpts{OutputCap: 1024}); err != nil { t.Fatal(err) }
		waitFile(t, filepath.Join(sb.Root(), "tmp/s1"), time.Minute)
		dir := filepath.Join(opts.StateDir, "checkpoints", id)
		if err := sb.(backend.Checkpointer).Checkpoint(t.Context(), dir); err != nil { t.Fatal(err) }
		sb.Destroy(t.Context())
		base := filepath.Join(opts.StateDir, "base-"+id)
		os.Rename(filepath.Join(dir, ckptUpper), base)
		ls := append([]backend.Layer{{Digest: "base-" + id, Dir: base}}, layers...)
		for i := 0; i < 4; i++ {
			start := time.Now()
			rid := fmt.Sprintf("zr%v%d", userns, i)
			rs, err := b.Create(t.Context(), backend.Spec{ID: rid, Layers: ls, MemoryBytes: 1 << 30, Restore: dir, UserNS: userns})
			if err != nil { t.Fatal(err) }
			el := time.Since(start)
			lb, _ := os.ReadFile(filepath.Join(b.runDir(rid), "restore.log"))
			lines := strings.Split(string(lb), "\n")
			t.Logf("userns=%v restore %v, log %d lines %d bytes; last: %s", userns, el, len(lines), len(lb), lines[len(lines)-2])
			if i == 3 && userns {
				os.WriteFile("/tmp/zz-restore-userns.log", lb, 0644)
			}
			if i == 3 && !userns {
				os.WriteFile("/tmp/zz-restore.log", lb, 0644)
			}
			rs.Destroy(context.Background())
		}
		os.RemoveAll(dir)
		os.RemoveAll(base)
		b.Close()
	}
}
