package metrics

import (
	"context"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"
)

// LayerSample is the on-demand loading state of one mounted layer (see
// image.LayerStat).
type LayerSample struct {
	Digest        string
	Size          int64 // blob bytes
	Resident      int64 // blob bytes cached in either cache, each once
	BlobResident  int64 // in the blob file's page cache
	FilesResident int64 // in the page cache of the mounted layer's files
	Refs          int
	DirectIO      bool
}

// LayerSource measures the mounted layers.
type LayerSource func(ctx context.Context) ([]LayerSample, error)

// Measuring walks every mounted layer's tree, so scrapes reuse a result
// this young (by default), and one measurement may take this long.
const (
	DefaultLayerMaxAge = 30 * time.Second
	layerTimeout       = 20 * time.Second
)

var (
	layerLabels    = []string{"layer"}
	layerSizeDesc  = prometheus.NewDesc("warren_layer_size_bytes", "Size of a mounted layer's EROFS blob.", layerLabels, nil)
	layerReadDesc  = prometheus.NewDesc("warren_layer_read_bytes", "Blob bytes of a mounted layer whose content is in the page cache (blob file or the layer's files, each block once): what sandboxes have read of it.", layerLabels, nil)
	layerBlobDesc  = prometheus.NewDesc("warren_layer_blob_cached_bytes", "Bytes of a mounted layer's blob file in the page cache (metadata; all reads of buffered mounts).", layerLabels, nil)
	layerFilesDesc = prometheus.NewDesc("warren_layer_files_cached_bytes", "Page cache of a mounted layer's files and directories.", layerLabels, nil)
	layerRefsDesc  = prometheus.NewDesc("warren_layer_sandboxes", "Sandboxes of this node using a mounted layer.", layerLabels, nil)
	layerDIODesc   = prometheus.NewDesc("warren_layer_direct_io", "1 if the layer's mount reads its blob with direct I/O.", layerLabels, nil)
	layerErrDesc   = prometheus.NewDesc("warren_layer_stats_errors_total", "Failed measurements of the mounted layers.", nil, nil)
)

type layerCollector struct {
	src    LayerSource
	maxAge time.Duration

	mu      sync.Mutex
	at      time.Time
	samples []LayerSample
	errs    float64
}

// RegisterLayers exports the mounted layers' sizes and how much of each
// sandboxes read, measured by src at scrape time; scrapes within maxAge
// of a measurement reuse it (0 means DefaultLayerMaxAge).
func (m *Metrics) RegisterLayers(src LayerSource, maxAge time.Duration) {
	if m == nil {
		return
	}
	if maxAge == 0 {
		maxAge = DefaultLayerMaxAge
	}
	m.Registry.MustRegister(&layerCollector{src: src, maxAge: maxAge})
}

func (c *layerCollector) Describe(ch chan<- *prometheus.Desc) {
	for _, d := range []*prometheus.Desc{layerSizeDesc, layerReadDesc, layerBlobDesc, layerFilesDesc, layerRefsDesc, layerDIODesc, layerErrDesc} {
		ch <- d
	}
}

func (c *layerCollector) Collect(ch chan<- prometheus.Metric) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.at.IsZero() || time.Since(c.at) >= c.maxAge {
		ctx, cancel := context.WithTimeout(context.Background(), layerTimeout)
		s, err := c.src(ctx)
		cancel()
		if err != nil {
			c.errs++ // keep the previous samples
		} else {
			c.samples = s
		}
		c.at = time.Now()
	}
	for _, s := range c.samples {
		g := func(d *prometheus.Desc, v float64) {
			ch <- prometheus.MustNewConstMetric(d, prometheus.GaugeValue, v, s.Digest)
		}
		g(layerSizeDesc, float64(s.Size))
		g(layerReadDesc, float64(s.Resident))
		g(layerBlobDesc, float64(s.BlobResident))
		g(layerFilesDesc, float64(s.FilesResident))
		g(layerRefsDesc, float64(s.Refs))
		dio := 0.0
		if s.DirectIO {
			dio = 1
		}
		g(layerDIODesc, dio)
	}
	ch <- prometheus.MustNewConstMetric(layerErrDesc, prometheus.CounterValue, c.errs)
}
