package e2e

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/warrenrl/warren/client"
	warrenv1 "github.com/warrenrl/warren/gen/warren/v1"
)

// TestFnGPUConfigured: a daemon given GPU device nodes and driver files
// (--gpu-device, --gpu-lib) reports its GPUs (Version, warren version),
// gives a job that asks for one (Run, RunBatch, warren fn run --gpus)
// that GPU's node and the driver's files read-only, and refuses a job
// that asks for more than it has. The nodes are made here with the
// numbers of /dev/null and /dev/zero: the plumbing is real, the GPUs are
// not (TestFnCUDA needs real ones).
func TestFnGPUConfigured(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	var args []string
	for i, mm := range [][2]uint32{{1, 3}, {1, 5}, {1, 7}} {
		name := []string{"nvidia0", "nvidia1", "nvidiactl"}[i]
		p := filepath.Join(dir, name)
		if err := unix.Mknod(p, unix.S_IFCHR|0o600, int(unix.Mkdev(mm[0], mm[1]))); err != nil {
			t.Fatal(err)
		}
		args = append(args, "--gpu-device", p)
	}
	lib := filepath.Join(dir, "libcuda.so.1")
	if err := os.WriteFile(lib, []byte("driver\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	e := newEnv(t, envOptions{serveArgs: append(args, "--gpu-lib", lib)})
	ctx := ctxFor(t, 2*time.Minute)

	v, err := e.c.Version(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if len(v.Gpus) != 2 || v.Gpus[0].Index != 0 || v.Gpus[1].Device != filepath.Join(dir, "nvidia1") {
		t.Fatalf("Version's GPUs: %v", v.Gpus)
	}
	if out, _, _ := e.cli(nil, "version"); !strings.Contains(out, "GPUs:   2: 0 ("+filepath.Join(dir, "nvidia0")+", free)") {
		t.Errorf("warren version: %q", out)
	}

	step := []*warrenv1.RunStep{{Argv: []string{"sh", "-c", "ls /dev | grep nvidia; cat /usr/local/nvidia/lib64/libcuda.so.1; head -c 3 /dev/nvidia1 | wc -c"}}}
	res, err := e.c.Run(ctx, &warrenv1.RunRequest{Image: imageName, Steps: step, Gpus: &warrenv1.RunGpus{Count: 2}})
	if err != nil {
		t.Fatal(err)
	}
	if s := res.Steps[0]; string(s.Stdout) != "nvidia0\nnvidia1\nnvidiactl\ndriver\n3\n" {
		t.Errorf("two-GPU job: %v", s)
	}
	res, err = e.c.Run(ctx, &warrenv1.RunRequest{Image: imageName, Steps: step})
	if err != nil {
		t.Fatal(err)
	}
	if s := res.Steps[0]; strings.Contains(string(s.Stdout), "nvidia") || strings.Contains(string(s.Stdout), "driver") {
		t.Errorf("a job without a GPU: %v", s)
	}
	_, err = e.c.Run(ctx, &warrenv1.RunRequest{Image: imageName, Steps: step, Gpus: &warrenv1.RunGpus{Count: 3}})
	wantCategory(t, err, client.CategoryInvalid, "a job asking for 3 of 2 GPUs")
	if err != nil && !strings.Contains(err.Error(), "this node has 2") {
		t.Errorf("error does not say how many GPUs the node has: %v", err)
	}
	out, errOut, code := e.cli(nil, "fn", "run", "--image", imageName, "--gpus", "1", "--", "sh", "-c", "ls /dev | grep nvidia")
	if code != 0 || out != "nvidia0\nnvidiactl\n" {
		t.Errorf("fn run --gpus 1: code %d stdout %q stderr %q", code, out, errOut)
	}
}

// TestFnCUDA runs nvidia-smi in a GPU job on a node with an NVIDIA GPU and
// its driver, found as the daemon finds them by default.
func TestFnCUDA(t *testing.T) {
	if _, err := os.Stat("/dev/nvidia0"); err != nil {
		t.Skip("this node has no NVIDIA GPU (/dev/nvidia0): nothing to run a CUDA job on")
	}
	t.Parallel()
	e := newEnv(t, envOptions{})
	ctx := ctxFor(t, 2*time.Minute)
	res, err := e.c.Run(ctx, &warrenv1.RunRequest{Image: imageName, Gpus: &warrenv1.RunGpus{Count: 1},
		Steps: []*warrenv1.RunStep{{Argv: []string{"nvidia-smi", "-L"}}}})
	if err != nil {
		t.Fatal(err)
	}
	if s := res.Steps[0]; s.Status != warrenv1.RunStatus_RUN_STATUS_ACCEPTED || !strings.Contains(string(s.Stdout), "GPU 0") {
		t.Fatalf("nvidia-smi -L in a GPU job: %v", s)
	}
}
