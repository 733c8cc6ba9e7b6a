package ui

import (
	"bytes"
	"cmp"
	"context"
	"fmt"
	"html/template"
	"math"
	"net/http"
	"net/url"
	"path"
	"slices"
	"sort"
	"strconv"
	"strings"
	"time"

	"github.com/warrenrl/warren/client"
	warrenv1 "github.com/warrenrl/warren/gen/warren/v1"
)

// pageNames are the templates under templates/, each rendered inside
// layout.html.
var pageNames = []string{"login", "error", "overview", "sandboxes", "sandbox", "images", "nodes"}

var funcs = template.FuncMap{
	"bytes":  formatBytes,
	"cpu":    formatCPU,
	"state":  stateName,
	"ms":     formatUnixMS,
	"ago":    formatAgo,
	"pct":    func(f float64) string { return fmt.Sprintf("%.0f%%", f*100) },
	"join":   strings.Join,
	"short":  shortDigest,
	"labels": sortedLabels,
	"secs":   func(ns uint64) string { return strconv.FormatFloat(float64(ns)/1e9, 'f', 2, 64) },
}

func parsePages() (map[string]*template.Template, error) {
	pages := map[string]*template.Template{}
	for _, name := range pageNames {
		t, err := template.New("layout.html").Funcs(funcs).ParseFS(assets, "templates/layout.html", "templates/partials.html", "templates/"+name+".html")
		if err != nil {
			return nil, fmt.Errorf("ui template %s: %w", name, err)
		}
		pages[name] = t
	}
	return pages, nil
}

// view is what every page's layout needs.
type view struct {
	Title   string
	Role    string
	Nav     string // the current section
	CSRF    string
	Login   bool // the listener needs a login (so offer a logout)
	LiveURL string
	Data    any
}

func (s *site) render(w http.ResponseWriter, r *http.Request, status int, page, nav, title, live string, data any) {
	v := view{Title: title, Role: s.ui.o.Role, Nav: nav, Login: s.token != "", LiveURL: live, Data: data}
	if _, ok := s.session(r); ok {
		v.CSRF = s.csrfToken(r)
	}
	var buf bytes.Buffer
	if err := s.ui.pages[page].Execute(&buf, v); err != nil {
		s.ui.o.Logger.Error("ui: render", "page", page, "err", err)
		http.Error(w, "internal error rendering the page", http.StatusInternalServerError)
		return
	}
	w.Header().Set("Content-Type", "text/html; charset=utf-8")
	w.WriteHeader(status)
	_, _ = w.Write(buf.Bytes())
}

func (s *site) renderLogin(w http.ResponseWriter, r *http.Request, status int, msg string) {
	// A token-less request learns nothing but that it must log in.
	v := view{Title: "Log in", Role: s.ui.o.Role, Data: msg}
	var buf bytes.Buffer
	if err := s.ui.pages["login"].Execute(&buf, v); err != nil {
		http.Error(w, "internal error", http.StatusInternalServerError)
		return
	}
	w.Header().Set("Content-Type", "text/html; charset=utf-8")
	w.WriteHeader(status)
	_, _ = w.Write(buf.Bytes())
}

func (s *site) errorPage(w http.ResponseWriter, r *http.Request, status int, msg string) {
	s.render(w, r, status, "error", "", http.StatusText(status), "", msg)
}

// apiError renders a failed call with the status its category maps to.
func (s *site) apiError(w http.ResponseWriter, r *http.Request, what string, err error) {
	status := http.StatusBadGateway
	switch client.CategoryOf(err) {
	case client.CategoryNotFound:
		status = http.StatusNotFound
	case client.CategoryInvalid:
		status = http.StatusBadRequest
	case client.CategoryPermissionDenied:
		status = http.StatusForbidden
	case client.CategoryUnavailable:
		status = http.StatusServiceUnavailable
	}
	s.errorPage(w, r, status, what+": "+err.Error())
}

// listAll lists every sandbox (with the labels). The dashboard filters, sorts and
// pages on the server, so however many there are, one page of rows
// reaches the browser.
func (s *site) listAll(ctx context.Context, labels map[string]string) ([]*warrenv1.Sandbox, error) {
	return s.c.List(ctx, labels)
}

// --- overview

type count struct {
	Key string
	N   int
}

type overviewData struct {
	Total     int
	States    []count
	Backends  []count
	Nodes     []*warrenv1.NodeStatus
	NodesErr  string
	Metrics   bool // rates are available
	CreatesPS string
	ExecMS    string
	Creates   string // SVG polyline points
	Exec      string
	Span      string
}

func (s *site) overview(w http.ResponseWriter, r *http.Request) {
	sbs, err := s.listAll(r.Context(), nil)
	if err != nil {
		s.apiError(w, r, "list sandboxes", err)
		return
	}
	d := overviewData{Total: len(sbs)}
	d.States, d.Backends = tally(sbs)
	nodes, err := s.c.NodeStatus(r.Context())
	if err != nil {
		d.NodesErr = err.Error()
	}
	d.Nodes = nodes
	pts, _, has := s.ui.hist.snapshot()
	d.Metrics = s.metrics && has
	if d.Metrics {
		d.CreatesPS, d.ExecMS = latestRates(pts)
		d.Creates = sparkPoints(pts, func(p point) float64 { return p.createsPS })
		d.Exec = sparkPoints(pts, func(p point) float64 { return p.execMeanMS })
		if len(pts) > 0 {
			d.Span = formatAgo(pts[0].at.UnixMilli())
		}
	}
	s.render(w, r, http.StatusOK, "overview", "overview", "Overview", "/ui/live", d)
}

func tally(sbs []*warrenv1.Sandbox) (states, backends []count) {
	st, be := map[string]int{}, map[string]int{}
	for _, sb := range sbs {
		st[stateName(sb.GetState())]++
		be[sb.GetBackend()]++
	}
	return counts(st), counts(be)
}

func counts(m map[string]int) []count {
	out := make([]count, 0, len(m))
	for k, n := range m {
		out = append(out, count{k, n})
	}
	slices.SortFunc(out, func(a, b count) int { return cmp.Or(b.N-a.N, strings.Compare(a.Key, b.Key)) })
	return out
}

func latestRates(pts []point) (creates, exec string) {
	creates, exec = "–", "–"
	if len(pts) == 0 {
		return
	}
	p := pts[len(pts)-1]
	creates = strconv.FormatFloat(p.createsPS, 'f', 2, 64)
	if !math.IsNaN(p.execMeanMS) {
		exec = strconv.FormatFloat(p.execMeanMS, 'f', 1, 64) + " ms"
	}
	return
}

// sparkPoints draws a series as the points of an SVG polyline in a
// 300×60 box (gaps drawn as zero).
func sparkPoints(pts []point, val func(point) float64) string {
	if len(pts) == 0 {
		return ""
	}
	top := 0.0
	for _, p := range pts {
		if v := val(p); !math.IsNaN(v) {
			top = max(top, v)
		}
	}
	if top == 0 {
		top = 1
	}
	var b strings.Builder
	for i, p := range pts {
		v := val(p)
		if math.IsNaN(v) {
			v = 0
		}
		x := 300.0
		if len(pts) > 1 {
			x = float64(i) * 300 / float64(len(pts)-1)
		}
		fmt.Fprintf(&b, "%.1f,%.1f ", x, 58-v/top*56)
	}
	return strings.TrimSpace(b.String())
}

// --- the list of sandboxes

type sandboxesData struct {
	Rows       []*warrenv1.Sandbox
	Matched    int
	Total      int
	Page       int
	Pages      int
	Per        int
	Sort       string
	Desc       bool
	Q          filter
	Prev, Next string // URLs; "" at the ends
	States     []string
	SortLinks  map[string]string
}

// filter is the list's query: labels "k=v,k2=v2", state, node, image and
// an id prefix.
type filter struct {
	Label, State, Node, Image, ID string
}

func (f filter) values() url.Values {
	v := url.Values{}
	for k, s := range map[string]string{"label": f.Label, "state": f.State, "node": f.Node, "image": f.Image, "id": f.ID} {
		if s != "" {
			v.Set(k, s)
		}
	}
	return v
}

const maxPerPage = 500

var sortKeys = map[string]func(a, b *warrenv1.Sandbox) int{
	"id":      func(a, b *warrenv1.Sandbox) int { return strings.Compare(a.GetId(), b.GetId()) },
	"created": func(a, b *warrenv1.Sandbox) int { return cmp.Compare(a.GetCreatedAtUnixMs(), b.GetCreatedAtUnixMs()) },
	"state":   func(a, b *warrenv1.Sandbox) int { return cmp.Compare(a.GetState(), b.GetState()) },
	"image":   func(a, b *warrenv1.Sandbox) int { return strings.Compare(a.GetImage(), b.GetImage()) },
	"node":    func(a, b *warrenv1.Sandbox) int { return strings.Compare(a.GetNode(), b.GetNode()) },
	"backend": func(a, b *warrenv1.Sandbox) int { return strings.Compare(a.GetBackend(), b.GetBackend()) },
}

func (s *site) sandboxes(w http.ResponseWriter, r *http.Request) {
	q := r.URL.Query()
	f := filter{Label: q.Get("label"), State: q.Get("state"), Node: q.Get("node"), Image: q.Get("image"), ID: q.Get("id")}
	labels, err := parseLabels(f.Label)
	if err != nil {
		s.errorPage(w, r, http.StatusBadRequest, err.Error())
		return
	}
	// The API filters by label; the rest is filtered here.
	all, err := s.listAll(r.Context(), labels)
	if err != nil {
		s.apiError(w, r, "list sandboxes", err)
		return
	}
	rows := all[:0:0]
	for _, sb := range all {
		if (f.State == "" || stateName(sb.GetState()) == f.State) &&
			(f.Node == "" || sb.GetNode() == f.Node) &&
			(f.Image == "" || sb.GetImage() == f.Image) &&
			(f.ID == "" || strings.HasPrefix(sb.GetId(), f.ID)) {
			rows = append(rows, sb)
		}
	}
	d := sandboxesData{Matched: len(rows), Total: len(all), Q: f, Sort: q.Get("sort"), Desc: q.Get("order") == "desc",
		States: []string{"creating", "running", "paused", "hibernated", "stopped", "lost", "deleting"}}
	less, ok := sortKeys[d.Sort]
	if !ok {
		d.Sort, less = "created", sortKeys["created"]
		if q.Get("order") == "" {
			d.Desc = true
		}
	}
	slices.SortStableFunc(rows, func(a, b *warrenv1.Sandbox) int {
		c := cmp.Or(less(a, b), strings.Compare(a.GetId(), b.GetId()))
		if d.Desc {
			return -c
		}
		return c
	})
	d.Per = clampInt(q.Get("per"), 50, 1, maxPerPage)
	d.Pages = max(1, (len(rows)+d.Per-1)/d.Per)
	d.Page = clampInt(q.Get("page"), 1, 1, d.Pages)
	lo := (d.Page - 1) * d.Per
	d.Rows = rows[min(lo, len(rows)):min(lo+d.Per, len(rows))]

	link := func(page int, sortKey string, desc bool) string {
		v := f.values()
		v.Set("sort", sortKey)
		v.Set("order", map[bool]string{true: "desc", false: "asc"}[desc])
		v.Set("per", strconv.Itoa(d.Per))
		v.Set("page", strconv.Itoa(page))
		return "/ui/sandboxes?" + v.Encode()
	}
	if d.Page > 1 {
		d.Prev = link(d.Page-1, d.Sort, d.Desc)
	}
	if d.Page < d.Pages {
		d.Next = link(d.Page+1, d.Sort, d.Desc)
	}
	d.SortLinks = map[string]string{}
	for k := range sortKeys {
		d.SortLinks[k] = link(1, k, k == d.Sort && !d.Desc)
	}
	s.render(w, r, http.StatusOK, "sandboxes", "sandboxes", "Sandboxes", "", d)
}

func parseLabels(s string) (map[string]string, error) {
	if strings.TrimSpace(s) == "" {
		return nil, nil
	}
	out := map[string]string{}
	for _, kv := range strings.Split(s, ",") {
		k, v, ok := strings.Cut(strings.TrimSpace(kv), "=")
		if !ok || k == "" {
			return nil, fmt.Errorf("label filter %q: want key=value[,key=value]", kv)
		}
		out[k] = v
	}
	return out, nil
}

func clampInt(s string, def, lo, hi int) int {
	n, err := strconv.Atoi(s)
	if err != nil {
		n = def
	}
	return min(max(n, lo), hi)
}

// --- one sandbox

type sandboxData struct {
	S          *warrenv1.Sandbox
	Stats      *warrenv1.SandboxStatsResponse
	StatsErr   string
	Procs      []*warrenv1.ProcessInfo
	Trajectory []*warrenv1.TrajectoryEntry
	TrajMore   bool
	Events     []*warrenv1.SecurityEvent
	EventsMore bool
	Dir        string
	Parent     string
	Files      []*warrenv1.FileInfo
	FilesErr   string
	FilesMore  bool
	File       *warrenv1.ReadFileResponse // the file shown, when ?path names one
	FileText   string
	Running    bool
}

// fileShowBytes is how much of a file the browser shows.
const fileShowBytes = 64 << 10

func (s *site) sandbox(w http.ResponseWriter, r *http.Request) {
	id := r.PathValue("id")
	ctx := r.Context()
	sb, err := s.c.Get(ctx, id)
	if err != nil {
		s.apiError(w, r, "sandbox", err)
		return
	}
	d := sandboxData{S: sb, Running: sb.GetState() == warrenv1.SandboxState_SANDBOX_STATE_RUNNING}
	if d.Running {
		if d.Stats, err = s.c.SandboxStats(ctx, id); err != nil {
			d.StatsErr = err.Error()
		}
		d.Procs, _ = s.c.ListProcesses(ctx, id)
	}
	if tr, err := s.c.ReadTrajectory(ctx, &warrenv1.ReadTrajectoryRequest{SandboxId: id, PageSize: 100}); err == nil {
		d.Trajectory, d.TrajMore = tr.GetEntries(), tr.GetNextPageToken() != ""
	}
	if ev, err := s.c.ListSandboxEvents(ctx, &warrenv1.ListSandboxEventsRequest{SandboxId: id, PageSize: 100}); err == nil {
		d.Events, d.EventsMore = ev.GetEvents(), ev.GetNextPageToken() != ""
	}
	if d.Running {
		s.browse(ctx, &d, id, r.URL.Query().Get("path"))
	}
	s.render(w, r, http.StatusOK, "sandbox", "sandboxes", "Sandbox "+id, "/ui/sandboxes/"+url.PathEscape(id)+"/live", d)
}

// browse fills the read-only file browser: a directory's first page, or
// the start of a file.
func (s *site) browse(ctx context.Context, d *sandboxData, id, p string) {
	if p == "" {
		p = "/"
	}
	p = path.Clean("/" + p)
	st, err := s.c.StatFile(ctx, id, p)
	if err != nil {
		d.FilesErr = err.Error()
		return
	}
	if !st.GetIsDir() {
		d.Dir = path.Dir(p)
		d.Parent = d.Dir
		f, err := s.c.ReadFile(ctx, &warrenv1.ReadFileRequest{SandboxId: id, Path: p, Length: fileShowBytes})
		if err != nil {
			d.FilesErr = err.Error()
			return
		}
		d.File = f
		d.FileText = strings.ToValidUTF8(string(f.GetContent()), "\uFFFD")
		return
	}
	d.Dir, d.Parent = p, path.Dir(p)
	res, err := s.c.ListFilesPage(ctx, &warrenv1.ListFilesRequest{SandboxId: id, Path: p, PageSize: 500})
	if err != nil {
		d.FilesErr = err.Error()
		return
	}
	d.Files, d.FilesMore = res.GetFiles(), res.GetNextPageToken() != ""
	sort.Slice(d.Files, func(i, j int) bool {
		if d.Files[i].GetIsDir() != d.Files[j].GetIsDir() {
			return d.Files[i].GetIsDir()
		}
		return d.Files[i].GetName() < d.Files[j].GetName()
	})
}

func (s *site) deleteSandbox(w http.ResponseWriter, r *http.Request) {
	id := r.PathValue("id")
	if err := s.c.Delete(r.Context(), id); err != nil && !client.IsNotFound(err) {
		s.apiError(w, r, "delete", err)
		return
	}
	s.listMu.Lock()
	s.listed = nil
	s.listMu.Unlock()
	http.Redirect(w, r, "/ui/sandboxes", http.StatusSeeOther)
}

// --- images and nodes

type imageRow struct {
	I      *warrenv1.Image
	Layers []layerRow
}

type layerRow struct {
	Digest   string
	Size     int64
	Resident int64 // read on demand: in the page cache
	Mounted  bool
	Refs     int32
	Nodes    []string
}

type imagesData struct {
	Images   []imageRow
	Layers   []*warrenv1.Layer
	StatsErr string
}

func (s *site) images(w http.ResponseWriter, r *http.Request) {
	ctx := r.Context()
	imgs, err := s.c.ListImages(ctx)
	if err != nil {
		s.apiError(w, r, "list images", err)
		return
	}
	var d imagesData
	d.Layers, _ = s.c.ListLayers(ctx)
	stats := map[string]*warrenv1.LayerStat{}
	if st, err := s.c.ImageStats(ctx); err == nil {
		for _, l := range st {
			stats[l.GetDigest()] = l
		}
	} else {
		d.StatsErr = err.Error()
	}
	held := map[string][]string{}
	if nodes, err := s.c.NodeStatus(ctx); err == nil {
		for _, n := range nodes {
			for _, l := range n.GetLayers() {
				held[l] = append(held[l], n.GetName())
			}
		}
	}
	for _, im := range imgs {
		row := imageRow{I: im}
		for _, dg := range im.GetLayers() {
			lr := layerRow{Digest: dg, Nodes: held[dg]}
			if st := stats[dg]; st != nil {
				lr.Size, lr.Resident, lr.Mounted, lr.Refs = st.GetSize(), st.GetResident(), st.GetMounted(), st.GetRefs()
			}
			row.Layers = append(row.Layers, lr)
		}
		d.Images = append(d.Images, row)
	}
	s.render(w, r, http.StatusOK, "images", "images", "Images", "", d)
}

func (s *site) nodes(w http.ResponseWriter, r *http.Request) {
	nodes, err := s.c.NodeStatus(r.Context())
	if err != nil {
		s.apiError(w, r, "node status", err)
		return
	}
	s.render(w, r, http.StatusOK, "nodes", "nodes", "Nodes", "/ui/live", nodes)
}

// --- formatting

func stateName(st warrenv1.SandboxState) string {
	n := strings.TrimPrefix(st.String(), "SANDBOX_STATE_")
	return strings.ToLower(n)
}

func formatBytes(v any) string {
	var n float64
	switch x := v.(type) {
	case int64:
		n = float64(x)
	case uint64:
		n = float64(x)
	case int:
		n = float64(x)
	case int32:
		n = float64(x)
	}
	units := []string{"B", "KiB", "MiB", "GiB", "TiB"}
	i := 0
	for n >= 1024 && i < len(units)-1 {
		n /= 1024
		i++
	}
	if i == 0 {
		return fmt.Sprintf("%.0f B", n)
	}
	return fmt.Sprintf("%.1f %s", n, units[i])
}

func formatCPU(millis int64) string {
	if millis == 0 {
		return "–"
	}
	return strconv.FormatFloat(float64(millis)/1000, 'f', -1, 64)
}

func formatUnixMS(ms int64) string {
	if ms == 0 {
		return "–"
	}
	return time.UnixMilli(ms).UTC().Format("2006-01-02 15:04:05")
}

func formatAgo(ms int64) string {
	if ms == 0 {
		return "–"
	}
	d := time.Since(time.UnixMilli(ms)).Round(time.Second)
	if d < 0 {
		return "in " + (-d).String()
	}
	return d.String() + " ago"
}

func shortDigest(s string) string {
	_, h, ok := strings.Cut(s, ":")
	if !ok {
		h = s
	}
	if len(h) > 12 {
		return h[:12]
	}
	return h
}

type label struct{ K, V string }

func sortedLabels(m map[string]string) []label {
	out := make([]label, 0, len(m))
	for k, v := range m {
		out = append(out, label{k, v})
	}
	slices.SortFunc(out, func(a, b label) int { return strings.Compare(a.K, b.K) })
	return out
}
