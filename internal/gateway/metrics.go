package gateway

import (
	"net/http"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promhttp"
)

// The cluster's metrics as this gateway sees them: each node's last
// report, and the sums over the nodes that are up. A node's own /metrics
// has the detail; these are what a dashboard of the cluster needs.
var (
	descUp        = prometheus.NewDesc("warren_cluster_node_up", "1 if the node is up (in the gossip pool and reporting), 0 if down.", []string{"node"}, nil)
	descSandboxes = prometheus.NewDesc("warren_cluster_node_sandboxes", "Live sandboxes on the node at its last report.", []string{"node"}, nil)
	descCPU       = prometheus.NewDesc("warren_cluster_node_cpu_millis", "CPU of the node in millicores: its capacity, and what its live sandboxes asked for.", []string{"node", "kind"}, nil)
	descMem       = prometheus.NewDesc("warren_cluster_node_memory_bytes", "Memory of the node: its capacity, and what its live sandboxes asked for.", []string{"node", "kind"}, nil)
	descLoad      = prometheus.NewDesc("warren_cluster_node_load", "1-minute load average per CPU of the node.", []string{"node"}, nil)
	descLayers    = prometheus.NewDesc("warren_cluster_node_layers_mounted", "Layers mounted on the node.", []string{"node"}, nil)
	descNodes     = prometheus.NewDesc("warren_cluster_nodes", "Nodes the gateway knows, by state.", []string{"state"}, nil)
	descTotal     = prometheus.NewDesc("warren_cluster_sandboxes", "Live sandboxes on the nodes that are up.", nil, nil)
	descTotalCPU  = prometheus.NewDesc("warren_cluster_cpu_millis", "CPU over the nodes that are up: capacity and allocated.", []string{"kind"}, nil)
	descTotalMem  = prometheus.NewDesc("warren_cluster_memory_bytes", "Memory over the nodes that are up: capacity and allocated.", []string{"kind"}, nil)
)

type collector struct{ g *Gateway }

func (collector) Describe(ch chan<- *prometheus.Desc) {
	for _, d := range []*prometheus.Desc{descUp, descSandboxes, descCPU, descMem, descLoad, descLayers, descNodes, descTotal, descTotalCPU, descTotalMem} {
		ch <- d
	}
}

func (c collector) Collect(ch chan<- prometheus.Metric) {
	var up, down, sbs, cpu, acpu, mem, amem float64
	g := func(d *prometheus.Desc, v float64, l ...string) {
		ch <- prometheus.MustNewConstMetric(d, prometheus.GaugeValue, v, l...)
	}
	for _, n := range c.g.nodes.all() {
		n.mu.Lock()
		isUp, st := n.up, n.status
		n.mu.Unlock()
		if !isUp {
			down++
			g(descUp, 0, n.name)
			continue
		}
		up++
		g(descUp, 1, n.name)
		g(descSandboxes, float64(st.GetSandboxes()), n.name)
		g(descCPU, float64(st.GetCpuMillis()), n.name, "capacity")
		g(descCPU, float64(st.GetAllocCpuMillis()), n.name, "allocated")
		g(descMem, float64(st.GetMemoryBytes()), n.name, "capacity")
		g(descMem, float64(st.GetAllocMemoryBytes()), n.name, "allocated")
		g(descLoad, st.GetLoad(), n.name)
		g(descLayers, float64(len(st.GetLayers())), n.name)
		sbs += float64(st.GetSandboxes())
		cpu += float64(st.GetCpuMillis())
		acpu += float64(st.GetAllocCpuMillis())
		mem += float64(st.GetMemoryBytes())
		amem += float64(st.GetAllocMemoryBytes())
	}
	g(descNodes, up, "up")
	g(descNodes, down, "down")
	g(descTotal, sbs)
	g(descTotalCPU, cpu, "capacity")
	g(descTotalCPU, acpu, "allocated")
	g(descTotalMem, mem, "capacity")
	g(descTotalMem, amem, "allocated")
}

// MetricsHandler serves the cluster metrics (GET /metrics of the gateway).
func (g *Gateway) MetricsHandler() http.Handler {
	reg := prometheus.NewRegistry()
	reg.MustRegister(collector{g}, prometheus.NewGoCollector())
	return promhttp.HandlerFor(reg, promhttp.HandlerOpts{})
}
