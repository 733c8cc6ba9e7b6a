package fncall

import (
	"bufio"
	"bytes"
	"context"
	"errors"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"sync"

	"golang.org/x/sys/unix"

	"github.com/warrenrl/warren/internal/backend"
	"github.com/warrenrl/warren/internal/errdefs"
)

// Where a GPU job finds the driver's user space: the node's files bound
// read-only at these directories, named as on the node, which the job's
// LD_LIBRARY_PATH and PATH lead with. A directory of Warren's own rather
// than the image's library directory: images lay theirs out differently
// (Debian's multiarch, /usr/lib64), and the binds must not shadow an
// image's own files.
const (
	GPULibDir = "/usr/local/nvidia/lib64"
	GPUBinDir = "/usr/local/nvidia/bin"
)

// DefaultGPULibs are the driver files a GPU job gets when the node's
// configuration names none: what CUDA programs load (libcuda, and the JIT
// it uses for PTX), NVML and the tool built on it.
var DefaultGPULibs = []string{"libcuda.so.1", "libnvidia-ml.so.1", "libnvidia-ptxjitcompiler.so.1", "nvidia-smi"}

// gpuControl are the NVIDIA device nodes that are not a GPU of their own:
// every GPU job gets those the node has.
var gpuControl = []string{"nvidiactl", "nvidia-uvm", "nvidia-uvm-tools", "nvidia-modeset"}

var gpuNode = regexp.MustCompile(`^nvidia([0-9]+)$`)

// GPUConfig names the node's GPU files.
type GPUConfig struct {
	// Devices are host paths of character device nodes: one named
	// nvidia<N> is a GPU (index N), any other every GPU job gets (the
	// driver's control nodes). Inside, each is /dev/<its name>.
	Devices []string
	// Libs are host paths of the driver's files, bound read-only: a name
	// with ".so" at GPULibDir/<name>, any other at GPUBinDir/<name>.
	Libs []string
}

// DiscoverGPUs finds the node's NVIDIA device nodes in /dev and the
// driver files of DefaultGPULibs: libraries through the dynamic linker's
// cache (ldconfig -p), tools in the usual directories. A node without
// /dev/nvidia0.. has no GPUs, whatever else it has.
func DiscoverGPUs() GPUConfig {
	var c GPUConfig
	ents, _ := os.ReadDir("/dev")
	for _, e := range ents {
		if gpuNode.MatchString(e.Name()) || slices.Contains(gpuControl, e.Name()) {
			c.Devices = append(c.Devices, "/dev/"+e.Name())
		}
	}
	if !slices.ContainsFunc(c.Devices, func(p string) bool { return gpuNode.MatchString(filepath.Base(p)) }) {
		return GPUConfig{}
	}
	cache := ldCache()
	for _, name := range DefaultGPULibs {
		if strings.Contains(name, ".so") {
			if p, ok := cache[name]; ok {
				c.Libs = append(c.Libs, p)
			}
			continue
		}
		for _, dir := range []string{"/usr/bin", "/usr/local/bin", "/usr/local/nvidia/bin", "/bin"} {
			if _, err := os.Stat(filepath.Join(dir, name)); err == nil {
				c.Libs = append(c.Libs, filepath.Join(dir, name))
				break
			}
		}
	}
	return c
}

// ldCache maps library names to paths as `ldconfig -p` lists them (the
// node's own architecture first: it lists those first).
func ldCache() map[string]string {
	out, err := exec.Command("ldconfig", "-p").Output()
	if err != nil {
		out, _ = exec.Command("/sbin/ldconfig", "-p").Output()
	}
	m := map[string]string{}
	sc := bufio.NewScanner(bytes.NewReader(out))
	for sc.Scan() {
		// "\tlibcuda.so.1 (libc6,x86-64) => /usr/lib/x86_64-linux-gnu/libcuda.so.1"
		name, rest, ok := strings.Cut(strings.TrimSpace(sc.Text()), " ")
		_, p, ok2 := strings.Cut(rest, "=> ")
		if ok && ok2 {
			if _, seen := m[name]; !seen {
				m[name] = strings.TrimSpace(p)
			}
		}
	}
	return m
}

// NodeGPUs are the node's GPU files, checked: what the container backend
// must allow (All) and what fncall gives a GPU job.
type NodeGPUs struct {
	GPUs    []GPU
	Control []backend.Device
	Mounts  []backend.Mount
}

// GPU is one of the node's GPUs.
type GPU struct {
	Index  int
	Path   string // on the node
	Device backend.Device
}

// Resolve checks c's files (device nodes must be character devices) and
// orders the GPUs by index. A configuration without a GPU yields none.
func (c GPUConfig) Resolve() (*NodeGPUs, error) {
	n := &NodeGPUs{}
	seen := map[string]bool{}
	for _, p := range c.Devices {
		var st unix.Stat_t
		if err := unix.Stat(p, &st); err != nil {
			return nil, errdefs.Wrap(errdefs.Invalid, err, "GPU device "+p)
		}
		if st.Mode&unix.S_IFMT != unix.S_IFCHR {
			return nil, errdefs.Invalidf("GPU device %s: not a character device", p)
		}
		name := filepath.Base(p)
		if seen[name] {
			return nil, errdefs.Invalidf("GPU device %s: a second device named %s", p, name)
		}
		seen[name] = true
		d := backend.Device{Name: name, Major: unix.Major(st.Rdev), Minor: unix.Minor(st.Rdev)}
		if m := gpuNode.FindStringSubmatch(name); m != nil {
			i, _ := strconv.Atoi(m[1])
			n.GPUs = append(n.GPUs, GPU{Index: i, Path: p, Device: d})
		} else {
			n.Control = append(n.Control, d)
		}
	}
	slices.SortFunc(n.GPUs, func(a, b GPU) int { return a.Index - b.Index })
	for _, p := range c.Libs {
		if _, err := os.Stat(p); err != nil {
			return nil, errdefs.Wrap(errdefs.Invalid, err, "GPU driver file")
		}
		name := filepath.Base(p)
		dir := GPUBinDir
		if strings.Contains(name, ".so") {
			dir = GPULibDir
		}
		if seen["lib:"+name] {
			return nil, errdefs.Invalidf("GPU driver file %s: a second file named %s", p, name)
		}
		seen["lib:"+name] = true
		n.Mounts = append(n.Mounts, backend.Mount{Source: p, Target: dir + "/" + name})
	}
	if len(n.GPUs) == 0 {
		return &NodeGPUs{}, nil
	}
	return n, nil
}

// All are every device node of n: what the node's device filter allows.
func (n *NodeGPUs) All() []backend.Device {
	if n == nil {
		return nil
	}
	out := slices.Clone(n.Control)
	for _, g := range n.GPUs {
		out = append(out, g.Device)
	}
	return out
}

// gpuSet hands out the node's GPUs: a GPU runs one exclusive job, or any
// number of shared ones, at a time. A job takes all the GPUs it asks for
// at once, so two jobs that each need two cannot each hold one and wait.
type gpuSet struct {
	mu      sync.Mutex
	changed chan struct{} // closed and replaced on every release
	gpus    []GPU
	excl    []bool
	shared  []int
}

func newGPUSet(g []GPU) *gpuSet {
	return &gpuSet{changed: make(chan struct{}), gpus: g, excl: make([]bool, len(g)), shared: make([]int, len(g))}
}

// acquire takes n GPUs, waiting while too few are free, and returns their
// positions in gpus.
func (s *gpuSet) acquire(ctx context.Context, n int, shared bool) ([]int, error) {
	for {
		s.mu.Lock()
		if got := s.pickLocked(n, shared); got != nil {
			for _, i := range got {
				if shared {
					s.shared[i]++
				} else {
					s.excl[i] = true
				}
			}
			s.mu.Unlock()
			return got, nil
		}
		ch := s.changed
		s.mu.Unlock()
		select {
		case <-ch:
		case <-ctx.Done():
			cat := errdefs.Unknown // cancelled: the caller went away
			if errors.Is(ctx.Err(), context.DeadlineExceeded) {
				cat = errdefs.DeadlineExceeded
			}
			return nil, errdefs.Wrap(cat, ctx.Err(), "waiting for a GPU")
		}
	}
}

// pickLocked chooses n GPUs a job may take now, or nil: for an exclusive
// job, GPUs no job holds; for a shared one, GPUs no exclusive job holds,
// the least shared first.
func (s *gpuSet) pickLocked(n int, shared bool) []int {
	var free []int
	for i := range s.gpus {
		if s.excl[i] || (!shared && s.shared[i] > 0) {
			continue
		}
		free = append(free, i)
	}
	if len(free) < n {
		return nil
	}
	if shared {
		slices.SortStableFunc(free, func(a, b int) int { return s.shared[a] - s.shared[b] })
	}
	return free[:n]
}

func (s *gpuSet) release(got []int, shared bool) {
	s.mu.Lock()
	defer s.mu.Unlock()
	for _, i := range got {
		if shared {
			s.shared[i]--
		} else {
			s.excl[i] = false
		}
	}
	close(s.changed)
	s.changed = make(chan struct{})
}

// GPUState is one GPU of the node and the jobs on it now.
type GPUState struct {
	GPU
	Exclusive bool // an exclusive job holds it
	Shared    int  // shared jobs on it
}

// GPUs reports the node's GPUs (none without Options.GPUs).
func (s *Service) GPUs() []GPUState {
	g := s.gpus
	if g == nil {
		return nil
	}
	g.mu.Lock()
	defer g.mu.Unlock()
	out := make([]GPUState, len(g.gpus))
	for i, gpu := range g.gpus {
		out[i] = GPUState{GPU: gpu, Exclusive: g.excl[i], Shared: g.shared[i]}
	}
	return out
}
