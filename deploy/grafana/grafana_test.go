// Package grafana holds Warren's Grafana dashboards (JSON, importable
// as they are) and the test that keeps them loadable and true to the
// metrics Warren exports.
package grafana

import (
	"context"
	"encoding/json"
	"go/ast"
	"go/parser"
	"go/token"
	"io/fs"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/warrenrl/warren/internal/metrics"
)

// dashboards are the files this directory ships.
var dashboards = []string{"fleet.json", "node.json", "images.json", "security.json"}

type dashboard struct {
	UID           string   `json:"uid"`
	Title         string   `json:"title"`
	SchemaVersion int      `json:"schemaVersion"`
	Tags          []string `json:"tags"`
	Time          *struct {
		From, To string
	} `json:"time"`
	Templating struct {
		List []struct {
			Name       string          `json:"name"`
			Type       string          `json:"type"`
			Query      json.RawMessage `json:"query"`
			Datasource *datasource     `json:"datasource"`
		} `json:"list"`
	} `json:"templating"`
	Panels []panel `json:"panels"`
}

type datasource struct {
	Type string `json:"type"`
	UID  string `json:"uid"`
}

type panel struct {
	ID         int         `json:"id"`
	Type       string      `json:"type"`
	Title      string      `json:"title"`
	Datasource *datasource `json:"datasource"`
	GridPos    *struct {
		H, W, X, Y *int
	} `json:"gridPos"`
	Targets []struct {
		RefID      string      `json:"refId"`
		Expr       string      `json:"expr"`
		Datasource *datasource `json:"datasource"`
	} `json:"targets"`
}

// panelTypes are the Grafana core panels the dashboards may use.
var panelTypes = []string{"row", "stat", "timeseries", "table", "gauge", "bargauge"}

// TestDashboards: every dashboard under deploy/grafana parses, carries
// what Grafana needs to import it (uid, title, schemaVersion, a
// Prometheus datasource variable, panels with unique ids and a grid
// position inside 24 columns), and every panel's PromQL names only
// metrics Warren registers (internal/*'s registrations, cross-checked
// against a real registry's /metrics families) and functions of PromQL.
func TestDashboards(t *testing.T) {
	known := registeredMetrics(t)
	uids := map[string]string{}
	for _, name := range dashboards {
		t.Run(name, func(t *testing.T) {
			data, err := os.ReadFile(name)
			if err != nil {
				t.Fatal(err)
			}
			var d dashboard
			dec := json.NewDecoder(strings.NewReader(string(data)))
			if err := dec.Decode(&d); err != nil {
				t.Fatalf("parse: %v", err)
			}
			if d.UID == "" || len(d.UID) > 40 || d.Title == "" || d.SchemaVersion < 36 || d.Time == nil {
				t.Errorf("uid %q (1-40 chars), title %q, schemaVersion %d (>= 36), time %v", d.UID, d.Title, d.SchemaVersion, d.Time)
			}
			if prev, dup := uids[d.UID]; dup {
				t.Errorf("uid %q also in %s", d.UID, prev)
			}
			uids[d.UID] = name
			vars := map[string]bool{}
			for _, v := range d.Templating.List {
				vars[v.Name] = true
				if v.Name == "datasource" && (v.Type != "datasource" || string(v.Query) != `"prometheus"`) {
					t.Errorf("variable datasource: type %q query %s, want a prometheus datasource variable", v.Type, v.Query)
				}
				if v.Type == "query" {
					var q struct{ Query string }
					if err := json.Unmarshal(v.Query, &q); err != nil {
						t.Errorf("variable %s: query %s: %v", v.Name, v.Query, err)
					}
					// label_values(expr, label): the last argument is a
					// label's name.
					m := labelValues.FindStringSubmatch(q.Query)
					if m == nil {
						t.Errorf("variable %s: query %q, want label_values(metric, label)", v.Name, q.Query)
						continue
					}
					checkExpr(t, "variable "+v.Name, m[1], known)
				}
			}
			if !vars["datasource"] {
				t.Errorf("no datasource variable: Grafana could not bind the dashboard to a Prometheus")
			}
			if len(d.Panels) == 0 {
				t.Fatal("no panels")
			}
			ids := map[int]bool{}
			queries := 0
			for _, p := range d.Panels {
				where := "panel " + strconv.Itoa(p.ID) + " " + strconv.Quote(p.Title)
				if p.ID <= 0 || ids[p.ID] {
					t.Errorf("%s: id missing or repeated", where)
				}
				ids[p.ID] = true
				if p.Title == "" || !slices.Contains(panelTypes, p.Type) {
					t.Errorf("%s: title or type %q", where, p.Type)
				}
				g := p.GridPos
				if g == nil || g.H == nil || g.W == nil || g.X == nil || g.Y == nil || *g.W < 1 || *g.X < 0 || *g.X+*g.W > 24 || *g.H < 1 {
					t.Errorf("%s: gridPos must have h, w, x, y inside 24 columns", where)
				}
				if p.Type == "row" {
					continue
				}
				if p.Datasource == nil || p.Datasource.Type != "prometheus" || p.Datasource.UID != "${datasource}" {
					t.Errorf("%s: datasource %+v, want prometheus ${datasource}", where, p.Datasource)
				}
				if len(p.Targets) == 0 {
					t.Errorf("%s: no queries", where)
				}
				refs := map[string]bool{}
				for _, tg := range p.Targets {
					if tg.RefID == "" || refs[tg.RefID] {
						t.Errorf("%s: refId %q missing or repeated", where, tg.RefID)
					}
					refs[tg.RefID] = true
					if tg.Expr == "" {
						t.Errorf("%s: empty query", where)
					}
					checkExpr(t, where, tg.Expr, known)
					queries++
				}
			}
			t.Logf("%d panels, %d queries", len(d.Panels), queries)
		})
	}
}

// promqlWords are PromQL's functions, aggregations and keywords.
var promqlWords = map[string]bool{}

func init() {
	for _, w := range strings.Fields(`sum min max avg count stddev stdvar topk bottomk quantile count_values group
		by without on ignoring group_left group_right bool and or unless offset
		rate irate increase delta idelta deriv histogram_quantile label_values label_replace label_join
		abs ceil floor round clamp clamp_min clamp_max sort sort_desc time timestamp vector scalar
		avg_over_time max_over_time min_over_time sum_over_time count_over_time last_over_time
		absent absent_over_time changes resets predict_linear holt_winters exp ln log2 log10 sqrt`) {
		promqlWords[w] = true
	}
}

var (
	quoted      = regexp.MustCompile(`"(?:[^"\\]|\\.)*"`)
	matchers    = regexp.MustCompile(`\{[^{}]*\}`)
	ranges      = regexp.MustCompile(`\[[^\[\]]*\]`)
	identifier  = regexp.MustCompile(`[A-Za-z_:][A-Za-z0-9_:]*`)
	numberLike  = regexp.MustCompile(`\b[0-9]+(\.[0-9]+)?(e[+-]?[0-9]+)?\b`)
	labelValues = regexp.MustCompile(`^label_values\((.+),\s*[A-Za-z_][A-Za-z0-9_]*\)$`)
	grouping    = regexp.MustCompile(`\b(by|without|on|ignoring|group_left|group_right)\s*\([^()]*\)`)
)

// checkExpr fails unless every identifier of expr outside label
// matchers, ranges, strings and grouping lists is a PromQL word or a
// metric Warren exports (histograms as _bucket, _sum and _count), and at
// least one is a metric.
func checkExpr(t *testing.T, where, expr string, known map[string]bool) {
	t.Helper()
	s := quoted.ReplaceAllString(expr, `""`)
	s = matchers.ReplaceAllString(s, " ")
	s = ranges.ReplaceAllString(s, " ")
	s = grouping.ReplaceAllString(s, " ")
	s = numberLike.ReplaceAllString(s, " ")
	metricsSeen := 0
	for _, id := range identifier.FindAllString(s, -1) {
		switch {
		case promqlWords[id]:
		case known[id]:
			metricsSeen++
		default:
			t.Errorf("%s: %q names %q, neither a metric Warren exports nor PromQL", where, expr, id)
		}
	}
	if metricsSeen == 0 {
		t.Errorf("%s: %q names no metric", where, expr)
	}
}

// registeredMetrics collects the metric names Warren's code registers:
// the Name of every prometheus *Opts literal and the name of every
// prometheus.NewDesc in internal/ (a histogram also as its _bucket, _sum
// and _count series), plus the Go runtime and process collectors'
// families. It cross-checks itself against a real registry: every
// family internal/metrics' registry gathers must be among them.
func registeredMetrics(t *testing.T) map[string]bool {
	t.Helper()
	known := map[string]bool{}
	fset := token.NewFileSet()
	err := filepath.WalkDir("../../internal", func(path string, d fs.DirEntry, err error) error {
		if err != nil || d.IsDir() || !strings.HasSuffix(path, ".go") || strings.HasSuffix(path, "_test.go") {
			return err
		}
		f, err := parser.ParseFile(fset, path, nil, 0)
		if err != nil {
			return err
		}
		ast.Inspect(f, func(n ast.Node) bool {
			switch n := n.(type) {
			case *ast.CompositeLit:
				sel, ok := n.Type.(*ast.SelectorExpr)
				if !ok || !strings.HasSuffix(sel.Sel.Name, "Opts") {
					return true
				}
				for _, el := range n.Elts {
					if kv, ok := el.(*ast.KeyValueExpr); ok {
						if k, ok := kv.Key.(*ast.Ident); ok && k.Name == "Name" {
							addName(known, kv.Value, strings.HasPrefix(sel.Sel.Name, "Histogram"))
						}
					}
				}
			case *ast.CallExpr:
				if sel, ok := n.Fun.(*ast.SelectorExpr); ok && sel.Sel.Name == "NewDesc" && len(n.Args) > 0 {
					// A Desc may back a histogram (MustNewConstHistogram);
					// accept its series names too.
					addName(known, n.Args[0], true)
				}
			}
			return true
		})
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	// A real registry: its families must all have been found above,
	// except the runtime's and the process's, which are added.
	m := metrics.New("create")
	m.RegisterLayers(func(context.Context) ([]metrics.LayerSample, error) {
		return []metrics.LayerSample{{Digest: "sha256:00", Size: 1}}, nil
	}, time.Second)
	m.TrajectoryBytesFunc(func() int64 { return 0 })
	m.BacklogFunc("container", func() int { return 0 })
	m.DeleteFailuresFunc("container", func() uint64 { return 0 })
	fams, err := m.Registry.Gather()
	if err != nil {
		t.Fatal(err)
	}
	warren := 0
	for _, f := range fams {
		name := f.GetName()
		if strings.HasPrefix(name, "warren_") {
			warren++
			if !known[name] {
				t.Errorf("the registry exports %s, which the scan of internal/ missed", name)
			}
			continue
		}
		known[name] = true
	}
	if warren < 10 || len(known) < 40 {
		t.Fatalf("too few metrics found (%d warren_ families gathered, %d names known): the scan is broken", warren, len(known))
	}
	return known
}

func addName(known map[string]bool, e ast.Expr, histogram bool) {
	lit, ok := e.(*ast.BasicLit)
	if !ok || lit.Kind != token.STRING {
		return
	}
	name, err := strconv.Unquote(lit.Value)
	if err != nil || !strings.HasPrefix(name, "warren_") {
		return
	}
	known[name] = true
	if histogram {
		for _, s := range []string{"_bucket", "_sum", "_count"} {
			known[name+s] = true
		}
	}
}
