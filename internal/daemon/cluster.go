package daemon

import (
	"context"
	"fmt"
	"os"
	"runtime"
	"strconv"
	"strings"
	"sync"

	"google.golang.org/protobuf/proto"

	warrenv1 "github.com/warrenrl/warren/gen/warren/v1"
	"github.com/warrenrl/warren/internal/errdefs"
)

// What a node does for a cluster (docs/ARCHITECTURE.md, "The cluster"):
// ids that start with its tag, the report gateways place by, batch
// creates and paged lists.

// MaxBatchCreate bounds one BatchCreate.
const MaxBatchCreate = 1000

// batchCreateParallel is how many creates of a batch run at once on one
// node: a create is mostly the kernel's work on 2 cores here (mounts,
// cgroups, namespaces); more in flight only queue in it.
const batchCreateParallel = 8

// BatchCreate makes req.count sandboxes from req.template, a few at a
// time. Each failure is reported in the response, not as the call's error.
func (m *Manager) BatchCreate(ctx context.Context, req *warrenv1.BatchCreateRequest) (_ *warrenv1.BatchCreateResponse, err error) {
	defer m.observe("BatchCreate", &err)
	if err := ValidBatch(req); err != nil {
		return nil, err
	}
	var (
		mu   sync.Mutex
		resp = &warrenv1.BatchCreateResponse{}
		wg   sync.WaitGroup
		sem  = make(chan struct{}, batchCreateParallel)
	)
	for range req.GetCount() {
		wg.Add(1)
		sem <- struct{}{}
		go func() {
			defer func() { <-sem; wg.Done() }()
			sb, err := m.Create(ctx, proto.Clone(req.GetTemplate()).(*warrenv1.CreateRequest))
			mu.Lock()
			defer mu.Unlock()
			if err != nil {
				resp.Errors = append(resp.Errors, err.Error())
				return
			}
			resp.Sandboxes = append(resp.Sandboxes, sb)
		}()
	}
	wg.Wait()
	return resp, nil
}

// ValidBatch checks a BatchCreate request's own fields (the template is
// checked as each create is).
func ValidBatch(req *warrenv1.BatchCreateRequest) error {
	if req.GetTemplate() == nil {
		return errdefs.Invalidf("batch create needs a template")
	}
	if req.GetTemplate().GetId() != "" {
		return errdefs.Invalidf("a batch create's template must not name an id: each sandbox gets its own")
	}
	if req.GetTemplate().GetClaim() != "" || req.GetTemplate().GetClaimStep() != warrenv1.ClaimStep_CLAIM_STEP_CREATE {
		return errdefs.Invalidf("a batch create's template must not carry a claim")
	}
	if req.GetTemplate().GetIdempotencyKey() != "" {
		return errdefs.Invalidf("a batch create's template must not carry an idempotency key: a key names one sandbox")
	}
	if n := req.GetCount(); n < 1 || n > MaxBatchCreate {
		return errdefs.Invalidf("batch create count %d: want 1..%d", n, MaxBatchCreate)
	}
	return nil
}

// NodeStatus reports this node's capacity, what its live sandboxes take
// and their QoS classes, what it still admits, its load and the layers
// it has mounted.
func (m *Manager) NodeStatus(ctx context.Context, _ *warrenv1.NodeStatusRequest) (_ *warrenv1.NodeStatusResponse, err error) {
	defer m.observe("NodeStatus", &err)
	st := &warrenv1.NodeStatus{
		Name:             m.cfg.NodeName,
		Tag:              m.cfg.NodeTag,
		Up:               true,
		CpuMillis:        int64(runtime.NumCPU()) * 1000,
		MemoryBytes:      memTotal(),
		MaxSandboxes:     int32(m.cfg.MaxSandboxes),
		Load:             loadPerCPU(),
		LabelCounts:      map[string]int32{},
		Qos:              map[string]int32{},
		CpuOvercommit:    m.cfg.CPUOvercommit,
		MemoryOvercommit: m.cfg.MemoryOvercommit,
		Free:             m.nodeFree(),
	}
	for _, s := range m.snapshot() {
		s.mu.Lock()
		live := s.st != stateStopped && s.st != stateDeleting
		if live {
			st.Sandboxes++
			st.AllocCpuMillis += s.info.GetResources().GetCpuMillis()
			st.AllocMemoryBytes += s.info.GetResources().GetMemoryBytes()
			for k, v := range s.info.GetLabels() {
				st.LabelCounts[k+"="+v]++
			}
			st.Qos[recordedQoS(s.info).Class]++
		}
		s.mu.Unlock()
	}
	if m.cfg.Images != nil {
		if c := m.cfg.Images.Mounts(); c != nil {
			for _, in := range c.List() {
				if in.Mounted {
					st.Layers = append(st.Layers, "sha256:"+in.Key)
				}
			}
		}
	}
	return &warrenv1.NodeStatusResponse{Nodes: []*warrenv1.NodeStatus{st}}, nil
}

// memTotal is the machine's memory in bytes (0 if /proc says nothing).
func memTotal() int64 {
	b, err := os.ReadFile("/proc/meminfo")
	if err != nil {
		return 0
	}
	for line := range strings.Lines(string(b)) {
		if rest, ok := strings.CutPrefix(line, "MemTotal:"); ok {
			kb, _ := strconv.ParseInt(strings.TrimSuffix(strings.TrimSpace(rest), " kB"), 10, 64)
			return kb << 10
		}
	}
	return 0
}

// loadPerCPU is the 1-minute load average over the CPUs.
func loadPerCPU() float64 {
	b, err := os.ReadFile("/proc/loadavg")
	if err != nil {
		return 0
	}
	var l float64
	if _, err := fmt.Sscan(string(b), &l); err != nil {
		return 0
	}
	return l / float64(runtime.NumCPU())
}
