package fncall

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/warrenrl/warren/internal/backend"
	"github.com/warrenrl/warren/internal/errdefs"
)

// fakeGPUs makes a node's GPU files in a directory of the test's: device
// nodes named as NVIDIA's, with the numbers of harmless devices (nvidia0
// is /dev/null's; nvidia1 is /dev/fuse's, which the standard devices
// cgroup denies: a job opening it proves the cgroup allows the GPUs), a
// control node, a "driver library" and a "tool" that runs.
func fakeGPUs(t *testing.T, gpus int) GPUConfig {
	dir := t.TempDir()
	nums := [][2]uint32{{1, 3}, {10, 229}}
	var c GPUConfig
	for i := 0; i < gpus; i++ {
		p := filepath.Join(dir, "nvidia"+string(rune('0'+i)))
		if err := unix.Mknod(p, unix.S_IFCHR|0o600, int(unix.Mkdev(nums[i][0], nums[i][1]))); err != nil {
			t.Fatal(err)
		}
		c.Devices = append(c.Devices, p)
	}
	ctl := filepath.Join(dir, "nvidiactl")
	if err := unix.Mknod(ctl, unix.S_IFCHR|0o600, int(unix.Mkdev(1, 5))); err != nil {
		t.Fatal(err)
	}
	c.Devices = append(c.Devices, ctl)
	lib := filepath.Join(dir, "libcuda.so.1")
	if err := os.WriteFile(lib, []byte("fake driver\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	smi := filepath.Join(dir, "nvidia-smi")
	if err := os.WriteFile(smi, []byte("#!/bin/sh\necho fake-smi\n"), 0o755); err != nil {
		t.Fatal(err)
	}
	c.Libs = []string{lib, smi}
	return c
}

func gpuService(t *testing.T, gpus int) (*Service, Image) {
	n, err := fakeGPUs(t, gpus).Resolve()
	if err != nil {
		t.Fatal(err)
	}
	return newService(t, Options{GPUs: n, NoSpare: true})
}

func runGPU(t *testing.T, s *Service, img Image, o JobOptions, script string) backend.StepResult {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	res, err := s.RunWith(ctx, img, []backend.Step{sh(script)}, o)
	if err != nil {
		t.Fatalf("run: %v", err)
	}
	return res.Steps[0]
}

// TestGPUJobSeesItsDevice: a job that asks for a GPU gets that GPU's
// device node (and can open it), the control node, and the driver's files
// read-only and executable; a job without one gets none of them, nor does
// the next job of the environment the GPU job used.
func TestGPUJobSeesItsDevice(t *testing.T) {
	s, img := gpuService(t, 2)
	r := runGPU(t, s, img, JobOptions{GPUs: 1}, `ls /dev | grep nvidia; head -c 4 /dev/nvidia0 | wc -c; cat /usr/local/nvidia/lib64/libcuda.so.1; nvidia-smi; echo $LD_LIBRARY_PATH
echo x > /usr/local/nvidia/lib64/libcuda.so.1 && echo WRITABLE; true`)
	want := "nvidia0\nnvidiactl\n0\nfake driver\nfake-smi\n/usr/local/nvidia/lib64\n"
	if string(r.Stdout) != want || r.Status != backend.StatusAccepted {
		t.Fatalf("GPU job: %v stdout %q stderr %q, want %q", r.Status, r.Stdout, r.Stderr, want)
	}
	if !strings.Contains(string(r.Stderr), "Read-only file system") {
		t.Errorf("writing the driver library: stderr %q, want a read-only file system", r.Stderr)
	}
	// Both GPUs: nvidia1 has /dev/fuse's numbers, which only the node's
	// GPU devices rule lets a sandbox open (cgroup v1 and hybrid).
	r = runGPU(t, s, img, JobOptions{GPUs: 2}, `ls /dev | grep nvidia; exec 3<>/dev/nvidia1 && echo opened`)
	if string(r.Stdout) != "nvidia0\nnvidia1\nnvidiactl\nopened\n" {
		t.Fatalf("two-GPU job: %v stdout %q stderr %q", r.Status, r.Stdout, r.Stderr)
	}
	// The GPU pool's environment after a two-GPU job: a one-GPU job
	// sees only its own node again.
	r = runGPU(t, s, img, JobOptions{GPUs: 1}, `ls /dev | grep nvidia; ls /usr/local/nvidia`)
	if string(r.Stdout) != "nvidia0\nnvidiactl\nbin\nlib64\n" {
		t.Errorf("a one-GPU job after a two-GPU job: %q", r.Stdout)
	}
	// No GPU: neither device nodes nor driver files.
	r = runGPU(t, s, img, JobOptions{}, `ls /dev | grep nvidia; ls /usr/local/nvidia 2>/dev/null; exec 3</dev/nvidia0`)
	if len(r.Stdout) != 0 || r.Status != backend.StatusNonZeroExit {
		t.Errorf("a job without a GPU: %v stdout %q stderr %q", r.Status, r.Stdout, r.Stderr)
	}
	if st := s.GPUs(); len(st) != 2 || st[0].Exclusive || st[1].Shared != 0 {
		t.Errorf("GPUs after the jobs: %+v", st)
	}
}

// TestGPUJobsTooMany: a job that asks for more GPUs than the node has is
// refused at once as invalid, naming the node's count, on a node with
// GPUs and on one without.
func TestGPUJobsTooMany(t *testing.T) {
	s, img := gpuService(t, 1)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	_, err := s.RunWith(ctx, img, []backend.Step{sh("true")}, JobOptions{GPUs: 2})
	if !errors.Is(err, errdefs.ErrInvalid) || !strings.Contains(err.Error(), "this node has 1") {
		t.Fatalf("two GPUs of one: %v", err)
	}
	none, img2 := newService(t, Options{})
	_, err = none.RunWith(ctx, img2, []backend.Step{sh("true")}, JobOptions{GPUs: 1})
	if !errors.Is(err, errdefs.ErrInvalid) || !strings.Contains(err.Error(), "this node has 0") {
		t.Fatalf("a GPU of none: %v", err)
	}
}

// TestGPUExclusiveSerializes: two exclusive jobs on a node's one GPU run
// one after the other, and see the same device; shared ones run at once.
func TestGPUExclusiveSerializes(t *testing.T) {
	s, img := gpuService(t, 1)
	const hold = 700 * time.Millisecond
	both := func(o JobOptions) (time.Duration, []string) {
		var wg sync.WaitGroup
		outs := make([]string, 2)
		start := time.Now()
		for i := range 2 {
			wg.Add(1)
			go func() {
				defer wg.Done()
				r := runGPU(t, s, img, o, "ls /dev | grep nvidia; sleep 0.7")
				outs[i] = string(r.Stdout)
			}()
		}
		wg.Wait()
		return time.Since(start), outs
	}
	// Two environments of the GPU pool first, so that neither measured
	// run waits for a create.
	both(JobOptions{GPUs: 1, SharedGPUs: true})
	d, outs := both(JobOptions{GPUs: 1})
	if d < 2*hold {
		t.Errorf("two exclusive jobs on one GPU took %v: they overlapped (each holds it %v)", d, hold)
	}
	for _, o := range outs {
		if o != "nvidia0\nnvidiactl\n" {
			t.Errorf("exclusive job saw %q", o)
		}
	}
	d, _ = both(JobOptions{GPUs: 1, SharedGPUs: true})
	if d >= 2*hold {
		t.Errorf("two shared jobs on one GPU took %v: they did not overlap", d)
	}
	// A waiting job gives up with its context.
	done := make(chan struct{})
	go func() {
		defer close(done)
		runGPU(t, s, img, JobOptions{GPUs: 1}, "sleep 1")
	}()
	deadline := time.Now().Add(10 * time.Second)
	for st := s.GPUs(); !st[0].Exclusive; st = s.GPUs() {
		if time.Now().After(deadline) {
			t.Fatal("the exclusive job never held the GPU")
		}
		time.Sleep(5 * time.Millisecond)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 100*time.Millisecond)
	defer cancel()
	if _, err := s.RunWith(ctx, img, []backend.Step{sh("true")}, JobOptions{GPUs: 1}); !errors.Is(err, errdefs.ErrDeadlineExceeded) {
		t.Errorf("waiting for a held GPU past the deadline: %v", err)
	}
	<-done
}
