package e2b

import (
	"encoding/base64"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/url"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"time"

	"connectrpc.com/connect"

	warrenv1 "github.com/warrenrl/warren/gen/warren/v1"
	"github.com/warrenrl/warren/internal/errdefs"
	"github.com/warrenrl/warren/internal/server"
)

// maxBody bounds a REST request body: they are small JSON objects.
const maxBody = 1 << 20

// restHandler serves the lifecycle REST API; every route needs X-API-Key.
func (s *Server) restHandler() http.Handler {
	mux := http.NewServeMux()
	mux.HandleFunc("POST /sandboxes", s.create)
	mux.HandleFunc("POST /v2/sandboxes", s.create)
	mux.HandleFunc("GET /sandboxes", s.listV1)
	mux.HandleFunc("GET /v2/sandboxes", s.listV2)
	mux.HandleFunc("GET /sandboxes/{id}", s.get)
	mux.HandleFunc("DELETE /sandboxes/{id}", s.kill)
	mux.HandleFunc("POST /sandboxes/{id}/timeout", s.setTimeout)
	mux.HandleFunc("PUT /sandboxes/{id}/network", s.setNetwork)
	mux.HandleFunc("POST /sandboxes/{id}/fork", s.fork)
	mux.HandleFunc("POST /sandboxes/{id}/pause", s.pause)
	mux.HandleFunc("POST /sandboxes/{id}/resume", s.resume)
	mux.HandleFunc("POST /sandboxes/{id}/connect", s.connect)
	mux.HandleFunc("GET /sandboxes/{id}/metrics", s.metrics)
	mux.HandleFunc("POST /v2/sandboxes/{id}/connect", s.connect)
	mux.HandleFunc("POST /sandboxes/{id}/snapshots", s.createSnapshot)
	mux.HandleFunc("GET /snapshots", s.listSnapshots)
	mux.HandleFunc("DELETE /templates/{id}", s.deleteTemplate)
	mux.HandleFunc("/", func(w http.ResponseWriter, r *http.Request) {
		// E2B's other routes (logs, templates, volumes...) are 501: a 404 would tell the SDKs the sandbox is
		// gone.
		code := http.StatusNotFound
		for _, p := range []string{"/sandboxes/", "/v2/sandboxes/", "/templates", "/v2/templates", "/v3/templates", "/volumes", "/snapshots", "/teams", "/secrets"} {
			if strings.HasPrefix(r.URL.Path, p) {
				code = http.StatusNotImplemented
			}
		}
		writeError(w, code, r.Method+" "+r.URL.Path+" is not part of Warren's E2B API (docs/E2B.md)")
	})
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if !s.keyOK(r.Header.Get("X-API-Key")) {
			writeError(w, http.StatusUnauthorized, "missing or unknown X-API-Key")
			return
		}
		r.Body = http.MaxBytesReader(w, r.Body, maxBody)
		mux.ServeHTTP(w, r)
	})
}

// apiError is E2B's error body.
type apiError struct {
	Code    int    `json:"code"`
	Message string `json:"message"`
}

func writeError(w http.ResponseWriter, code int, msg string) {
	writeJSON(w, code, apiError{Code: code, Message: msg})
}

func writeJSON(w http.ResponseWriter, code int, v any) {
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(code)
	_ = json.NewEncoder(w).Encode(v)
}

// httpStatus maps an error's category to the status E2B's SDKs read:
// they turn 400, 401, 404, 409, 429, 5xx into their own exceptions.
func httpStatus(err error) int {
	switch server.CategoryOf(err) {
	case errdefs.NotFound:
		return http.StatusNotFound
	case errdefs.Invalid:
		return http.StatusBadRequest
	case errdefs.Unauthenticated:
		return http.StatusUnauthorized
	case errdefs.PermissionDenied:
		return http.StatusForbidden
	case errdefs.Conflict:
		return http.StatusConflict
	case errdefs.Exhausted:
		return http.StatusTooManyRequests
	case errdefs.Unavailable:
		return http.StatusServiceUnavailable
	case errdefs.DeadlineExceeded:
		return http.StatusGatewayTimeout
	case errdefs.Unsupported:
		return http.StatusNotImplemented
	}
	return http.StatusInternalServerError
}

func (s *Server) fail(w http.ResponseWriter, err error) {
	code := httpStatus(err)
	if code == http.StatusInternalServerError {
		s.log.Warn("e2b call failed", "err", err)
	}
	msg := err.Error()
	var ce *connect.Error
	if errors.As(err, &ce) {
		msg = ce.Message() // a node's answer through a gateway, without connect's code prefix
	}
	writeError(w, code, msg)
}

// decode reads an optional JSON body into v (an empty body leaves it).
func decode(r *http.Request, v any) error {
	b, err := io.ReadAll(r.Body)
	if err != nil {
		return errdefs.Wrap(errdefs.Invalid, err, "read body")
	}
	if len(strings.TrimSpace(string(b))) == 0 {
		return nil
	}
	if err := json.Unmarshal(b, v); err != nil {
		return errdefs.Wrap(errdefs.Invalid, err, "decode JSON body")
	}
	return nil
}

// newSandbox is the create body of POST /sandboxes and /v2/sandboxes.
// Fields Warren does not act on (autoPause, mcp, network rules, volume
// mounts...) are refused when set rather than silently dropped, except
// those that only tune E2B's own infrastructure.
type newSandbox struct {
	TemplateID          string            `json:"templateID"`
	Timeout             *int64            `json:"timeout"`
	Metadata            map[string]string `json:"metadata"`
	EnvVars             map[string]string `json:"envVars"`
	AllowInternetAccess *bool             `json:"allow_internet_access"`
	Network             *netConfig        `json:"network"`
	AutoPause           *bool             `json:"autoPause"`
	VolumeMounts        []json.RawMessage `json:"volumeMounts"`
	MCP                 json.RawMessage   `json:"mcp"`
}

// created is the body of a create, connect or resume answer.
type created struct {
	TemplateID      string  `json:"templateID"`
	SandboxID       string  `json:"sandboxID"`
	ClientID        string  `json:"clientID"`
	EnvdVersion     string  `json:"envdVersion"`
	EnvdAccessToken string  `json:"envdAccessToken"`
	Domain          *string `json:"domain"`
}

// listed is a sandbox in a list; detail adds what GET /sandboxes/{id} says.
type listed struct {
	TemplateID  string            `json:"templateID"`
	SandboxID   string            `json:"sandboxID"`
	ClientID    string            `json:"clientID"`
	StartedAt   string            `json:"startedAt"`
	EndAt       string            `json:"endAt"`
	CPUCount    int64             `json:"cpuCount"`
	MemoryMB    int64             `json:"memoryMB"`
	DiskSizeMB  int64             `json:"diskSizeMB"`
	EnvdVersion string            `json:"envdVersion"`
	State       string            `json:"state"`
	Metadata    map[string]string `json:"metadata"`
}

type detail struct {
	listed
	EnvdAccessToken     string       `json:"envdAccessToken"`
	Domain              *string      `json:"domain"`
	AllowInternetAccess bool         `json:"allowInternetAccess"`
	Network             *networkInfo `json:"network,omitempty"`
}

// networkInfo is a Warren allowlist policy in E2B's words.
type networkInfo struct {
	AllowOut []string `json:"allowOut"`
	DenyOut  []string `json:"denyOut"`
}

// describeNetwork is the inverse of networkPolicy, for GET.
func describeNetwork(p *warrenv1.NetworkPolicy) (bool, *networkInfo) {
	switch p.GetMode() {
	case "open":
		return true, nil
	case "allowlist":
		ni := &networkInfo{DenyOut: []string{"0.0.0.0/0"}, AllowOut: []string{}}
		for _, r := range p.GetAllow() {
			a := r.GetCidr()
			if r.GetHost() != "" {
				a = r.GetHost()
			}
			ni.AllowOut = append(ni.AllowOut, a)
		}
		return false, ni
	}
	return false, nil
}

// clientID is reported where E2B names the client a sandbox runs on.
const clientID = "warren"

func (s *Server) created(sb *warrenv1.Sandbox) created {
	return created{TemplateID: sb.GetImage(), SandboxID: sb.GetId(), ClientID: clientID,
		EnvdVersion: EnvdVersion, EnvdAccessToken: s.token(sb.GetId())}
}

// e2bState is the E2B state of a sandbox, "" for one E2B has no word for
// (creating, stopped, deleting, lost): those are not shown.
func e2bState(st warrenv1.SandboxState) string {
	switch st {
	case warrenv1.SandboxState_SANDBOX_STATE_RUNNING:
		return "running"
	case warrenv1.SandboxState_SANDBOX_STATE_PAUSED, warrenv1.SandboxState_SANDBOX_STATE_HIBERNATED:
		return "paused"
	}
	return ""
}

func toListed(sb *warrenv1.Sandbox) listed {
	res := sb.GetResources()
	cpus := int64(runtime.NumCPU())
	if m := res.GetCpuMillis(); m > 0 {
		cpus = (m + 999) / 1000
	}
	end := time.UnixMilli(sb.GetExpiresAtUnixMs())
	if sb.GetExpiresAtUnixMs() == 0 {
		// No deadline: E2B always has one; far enough to mean none.
		end = time.UnixMilli(sb.GetCreatedAtUnixMs()).AddDate(100, 0, 0)
	}
	md := sb.GetLabels()
	if md == nil {
		md = map[string]string{}
	}
	return listed{
		TemplateID: sb.GetImage(), SandboxID: sb.GetId(), ClientID: clientID,
		StartedAt:   time.UnixMilli(sb.GetCreatedAtUnixMs()).UTC().Format(time.RFC3339Nano),
		EndAt:       end.UTC().Format(time.RFC3339Nano),
		CPUCount:    cpus,
		MemoryMB:    res.GetMemoryBytes() >> 20,
		DiskSizeMB:  res.GetDiskBytes() >> 20,
		EnvdVersion: EnvdVersion,
		State:       e2bState(sb.GetState()),
		Metadata:    md,
	}
}

func (s *Server) create(w http.ResponseWriter, r *http.Request) {
	var body newSandbox
	if err := decode(r, &body); err != nil {
		s.fail(w, err)
		return
	}
	if body.TemplateID == "" {
		s.fail(w, errdefs.Invalidf("templateID is required: the name of a Warren image"))
		return
	}
	if body.AutoPause != nil && *body.AutoPause {
		s.fail(w, errdefs.Unsupportedf("autoPause is not supported: a Warren sandbox is deleted when its timeout passes"))
		return
	}
	if len(body.VolumeMounts) > 0 || (len(body.MCP) > 0 && string(body.MCP) != "null") {
		s.fail(w, errdefs.Unsupportedf("volumeMounts and mcp are not supported"))
		return
	}
	// E2B keeps a paused sandbox until it is resumed: its lifetime stops
	// while it is paused (docs/E2B.md).
	req := &warrenv1.CreateRequest{Image: body.TemplateID, Env: body.EnvVars, Labels: body.Metadata, KeepWhilePaused: true}
	if body.Timeout != nil {
		if *body.Timeout <= 0 {
			s.fail(w, errdefs.Invalidf("timeout %d: want seconds > 0", *body.Timeout))
			return
		}
		req.TimeoutSeconds = *body.Timeout
	}
	pol, err := networkPolicy(body.AllowInternetAccess, body.Network)
	if err != nil {
		s.fail(w, err)
		return
	}
	if strings.HasPrefix(body.TemplateID, snapshotPrefix) {
		s.createFromSnapshot(w, r, body, pol)
		return
	}
	req.Network = pol
	sb, err := s.m.Create(r.Context(), req)
	if err != nil {
		s.fail(w, err)
		return
	}
	writeJSON(w, http.StatusCreated, s.created(sb))
}

// visible gets a sandbox E2B may see: one in a state it has no word for
// is not found.
func (s *Server) visible(r *http.Request, id string) (*warrenv1.Sandbox, error) {
	sb, err := s.m.Get(r.Context(), &warrenv1.GetRequest{Id: id})
	if err != nil {
		return nil, err
	}
	if sb.GetState() == warrenv1.SandboxState_SANDBOX_STATE_LOST {
		return nil, lostErr(sb)
	}
	if isSnapshot(sb) {
		return nil, errdefs.NotFoundf("%s is a snapshot, not a sandbox: create a sandbox from it with template %s%s", id, snapshotPrefix, id)
	}
	if e2bState(sb.GetState()) == "" {
		return nil, errdefs.NotFoundf("sandbox %s is %s", id, strings.ToLower(strings.TrimPrefix(sb.GetState().String(), "SANDBOX_STATE_")))
	}
	return sb, nil
}

// lostErr is the error of a call on a LOST sandbox: its node (or, on a
// node, its agent) cannot be reached now. It is Unavailable (503), not
// the 404 of a gone sandbox, which the SDKs would take for killed.
func lostErr(sb *warrenv1.Sandbox) error {
	why := sb.GetDeadReason() // a gateway's: "node N is down: ..."
	if why == "" {
		why = "its node cannot reach it now"
	}
	return errdefs.Unavailablef("sandbox %s is lost for now (%s); retry when it is back", sb.GetId(), why)
}

func (s *Server) get(w http.ResponseWriter, r *http.Request) {
	sb, err := s.visible(r, r.PathValue("id"))
	if err != nil {
		s.fail(w, err)
		return
	}
	d := detail{listed: toListed(sb), EnvdAccessToken: s.token(sb.GetId())}
	d.AllowInternetAccess, d.Network = describeNetwork(sb.GetNetwork())
	writeJSON(w, http.StatusOK, d)
}

// listQuery is what both list routes filter by.
type listQuery struct {
	metadata map[string]string
	states   []string
}

func parseListQuery(q url.Values) (listQuery, error) {
	lq := listQuery{states: []string{"running", "paused"}}
	if m := q.Get("metadata"); m != "" {
		// The SDKs quote each key and value, then form-encode the pairs.
		vals, err := url.ParseQuery(m)
		if err != nil {
			return lq, errdefs.Wrap(errdefs.Invalid, err, "metadata filter")
		}
		lq.metadata = map[string]string{}
		for k, v := range vals {
			uk, err1 := url.PathUnescape(k)
			uv, err2 := url.PathUnescape(v[len(v)-1])
			if err := errors.Join(err1, err2); err != nil {
				return lq, errdefs.Wrap(errdefs.Invalid, err, "metadata filter")
			}
			lq.metadata[uk] = uv
		}
	}
	if st := q.Get("state"); st != "" {
		lq.states = nil
		for _, x := range strings.Split(st, ",") {
			if x != "running" && x != "paused" {
				return lq, errdefs.Invalidf("state %q: want running or paused", x)
			}
			lq.states = append(lq.states, x)
		}
	}
	return lq, nil
}

// listed lists the sandboxes matching q, newest first.
func (s *Server) listMatching(r *http.Request, q listQuery) ([]listed, error) {
	res, err := s.m.List(r.Context(), &warrenv1.ListRequest{Labels: q.metadata})
	if err != nil {
		return nil, err
	}
	var out []listed
	for _, sb := range res.GetSandboxes() {
		l := toListed(sb)
		if l.State != "" && slices.Contains(q.states, l.State) && !isSnapshot(sb) {
			out = append(out, l)
		}
	}
	slices.SortFunc(out, func(a, b listed) int {
		if c := strings.Compare(b.StartedAt, a.StartedAt); c != 0 {
			return c
		}
		return strings.Compare(a.SandboxID, b.SandboxID)
	})
	return out, nil
}

func (s *Server) listV1(w http.ResponseWriter, r *http.Request) {
	q, err := parseListQuery(r.URL.Query())
	if err != nil {
		s.fail(w, err)
		return
	}
	q.states = []string{"running"}
	out, err := s.listMatching(r, q)
	if err != nil {
		s.fail(w, err)
		return
	}
	writeJSON(w, http.StatusOK, nonNil(out))
}

// defaultLimit and maxLimit bound a page of GET /v2/sandboxes.
const defaultLimit, maxLimit = 100, 1000

// listV2 pages with X-Next-Token: the token is where the last page ended
// (its start time and id), so sandboxes created or deleted in between
// neither repeat nor shift the pages.
func (s *Server) listV2(w http.ResponseWriter, r *http.Request) {
	qv := r.URL.Query()
	q, err := parseListQuery(qv)
	if err != nil {
		s.fail(w, err)
		return
	}
	limit := defaultLimit
	if l := qv.Get("limit"); l != "" {
		if limit, err = strconv.Atoi(l); err != nil || limit < 1 || limit > maxLimit {
			s.fail(w, errdefs.Invalidf("limit %q: want 1 to %d", l, maxLimit))
			return
		}
	}
	out, err := s.listMatching(r, q)
	if err != nil {
		s.fail(w, err)
		return
	}
	if tok := qv.Get("nextToken"); tok != "" {
		b, err := base64.RawURLEncoding.DecodeString(tok)
		after, id, ok := strings.Cut(string(b), "\x00")
		if err != nil || !ok {
			s.fail(w, errdefs.Invalidf("bad nextToken"))
			return
		}
		i := 0
		for i < len(out) && (out[i].StartedAt > after || (out[i].StartedAt == after && out[i].SandboxID <= id)) {
			i++
		}
		out = out[i:]
	}
	if len(out) > limit {
		last := out[limit-1]
		w.Header().Set("X-Next-Token", base64.RawURLEncoding.EncodeToString([]byte(last.StartedAt+"\x00"+last.SandboxID)))
		out = out[:limit]
	}
	writeJSON(w, http.StatusOK, nonNil(out))
}

func nonNil(l []listed) []listed {
	if l == nil {
		return []listed{}
	}
	return l
}

func (s *Server) kill(w http.ResponseWriter, r *http.Request) {
	if _, err := s.m.Delete(r.Context(), &warrenv1.DeleteRequest{Id: r.PathValue("id")}); err != nil {
		s.fail(w, err)
		return
	}
	w.WriteHeader(http.StatusNoContent)
}

func (s *Server) setTimeout(w http.ResponseWriter, r *http.Request) {
	var body struct {
		Timeout int64 `json:"timeout"`
	}
	if err := decode(r, &body); err != nil {
		s.fail(w, err)
		return
	}
	if body.Timeout <= 0 {
		s.fail(w, errdefs.Invalidf("timeout %d: want seconds > 0", body.Timeout))
		return
	}
	id := r.PathValue("id")
	if _, err := s.visible(r, id); err != nil {
		s.fail(w, err)
		return
	}
	if _, err := s.m.ExtendTimeout(r.Context(), &warrenv1.ExtendTimeoutRequest{Id: id, TimeoutSeconds: body.Timeout}); err != nil {
		s.fail(w, err)
		return
	}
	w.WriteHeader(http.StatusNoContent)
}

// pause hibernates the sandbox (its memory and files go to disk and it
// holds nothing on the node), or, where this node or sandbox cannot be
// checkpointed now (no CRIU on the node, a connection to its agent still
// open), freezes it in memory (Pause). Either way connect resumes
// it where it stopped.
func (s *Server) pause(w http.ResponseWriter, r *http.Request) {
	id := r.PathValue("id")
	sb, err := s.visible(r, id)
	if err != nil {
		s.fail(w, err)
		return
	}
	if e2bState(sb.GetState()) == "paused" {
		writeError(w, http.StatusConflict, "sandbox "+id+" is already paused")
		return
	}
	// Its open process streams end first, as E2B's pause drops every
	// connection into the sandbox: a checkpoint needs the agent idle.
	s.open.end(id, 5*time.Second)
	s.ports.CloseAll(id)
	_, err = s.m.Hibernate(r.Context(), &warrenv1.HibernateRequest{Id: id})
	if c := server.CategoryOf(err); c == errdefs.Unsupported || c == errdefs.Unavailable || c == errdefs.Conflict {
		s.log.Debug("e2b pause: hibernate refused, freezing instead", "id", id, "err", err)
		_, err = s.m.Pause(r.Context(), &warrenv1.PauseRequest{Id: id})
	}
	if err != nil {
		s.fail(w, err)
		return
	}
	w.WriteHeader(http.StatusNoContent)
}

// connect answers 200 for a running sandbox and 201 for one it resumed.
// A timeout in the body becomes the deadline of a resumed sandbox (E2B's
// fresh timeout; without one it gets back the time it had left when it
// paused: keep_while_paused), and of a running one if it is later than
// the one it has (as the SDKs document).
func (s *Server) connect(w http.ResponseWriter, r *http.Request) {
	var body struct {
		Timeout int64 `json:"timeout"`
	}
	if err := decode(r, &body); err != nil {
		s.fail(w, err)
		return
	}
	s.resumeAndAnswer(w, r, body.Timeout, http.StatusOK)
}

// resume is the older SDKs' POST /sandboxes/{id}/resume: 201, or 409 for
// a sandbox that is not paused.
func (s *Server) resume(w http.ResponseWriter, r *http.Request) {
	var body struct {
		Timeout int64 `json:"timeout"`
	}
	if err := decode(r, &body); err != nil {
		s.fail(w, err)
		return
	}
	s.resumeAndAnswer(w, r, body.Timeout, http.StatusConflict)
}

func (s *Server) resumeAndAnswer(w http.ResponseWriter, r *http.Request, timeout int64, runningCode int) {
	id := r.PathValue("id")
	if timeout < 0 {
		s.fail(w, errdefs.Invalidf("timeout %d: want seconds >= 0", timeout))
		return
	}
	sb, err := s.visible(r, id)
	if err != nil {
		s.fail(w, err)
		return
	}
	code := runningCode
	if timeout > 0 && code == http.StatusOK && e2bState(sb.GetState()) == "running" &&
		sb.GetExpiresAtUnixMs() >= time.Now().Add(time.Duration(timeout)*time.Second).UnixMilli() {
		timeout = 0 // a running sandbox's deadline only moves later
	}
	if e2bState(sb.GetState()) == "paused" {
		res, err := s.m.Resume(r.Context(), &warrenv1.ResumeRequest{Id: id})
		if err != nil {
			s.fail(w, err)
			return
		}
		sb, code = res.GetSandbox(), http.StatusCreated
	} else if code == http.StatusConflict {
		writeError(w, code, fmt.Sprintf("sandbox %s is not paused", id))
		return
	}
	if timeout > 0 {
		if sb, err = s.m.ExtendTimeout(r.Context(), &warrenv1.ExtendTimeoutRequest{Id: id, TimeoutSeconds: timeout}); err != nil {
			s.fail(w, err)
			return
		}
	}
	writeJSON(w, code, s.created(sb))
}

// netConfig is E2B's egress configuration (create's "network", and the
// body of PUT /sandboxes/{id}/network with allow_internet_access).
type netConfig struct {
	AllowOut            []string        `json:"allowOut"`
	DenyOut             []string        `json:"denyOut"`
	AllowInternetAccess *bool           `json:"allow_internet_access"`
	DNSServers          []string        `json:"dnsServers"`
	Rules               json.RawMessage `json:"rules"`
	EgressProxy         json.RawMessage `json:"egressProxy"`
	MaskRequestHost     string          `json:"maskRequestHost"`
	AllowPublicTraffic  *bool           `json:"allowPublicTraffic"`
	HTTPSPorts          []int           `json:"httpsPorts"`
}

func rawSet(m json.RawMessage) bool { return len(m) > 0 && string(m) != "null" && string(m) != "{}" }

// networkPolicy maps E2B's egress settings onto a Warren policy, nil for
// the node's default (no network). E2B denies by CIDR and allows by CIDR
// or name, allowing over denying; Warren's policies are allow lists, so
// only "deny everything but allowOut" (denyOut 0.0.0.0/0, or
// allow_internet_access false) and "allow everything" map: the first to
// mode allowlist (none without allowOut), the second to mode open.
// E2B opens the internet when nothing is said; Warren does not (docs/E2B.md).
func networkPolicy(allowInternet *bool, n *netConfig) (*warrenv1.NetworkPolicy, error) {
	if n == nil {
		n = &netConfig{}
	}
	if n.AllowInternetAccess != nil {
		allowInternet = n.AllowInternetAccess
	}
	if rawSet(n.Rules) || rawSet(n.EgressProxy) || n.MaskRequestHost != "" || len(n.HTTPSPorts) > 0 || len(n.DNSServers) > 0 {
		return nil, errdefs.Unsupportedf("network rules, egress proxies, masked hosts, https ports and DNS servers are not supported: sandboxes resolve through the node's resolver")
	}
	if n.AllowPublicTraffic != nil && !*n.AllowPublicTraffic {
		return nil, errdefs.Unsupportedf("allowPublicTraffic false is not supported: a sandbox's ports are reached through the E2B door without a token (docs/E2B.md)")
	}
	denyAll := allowInternet != nil && !*allowInternet
	for _, d := range n.DenyOut {
		if d != "0.0.0.0/0" {
			return nil, errdefs.Unsupportedf("denyOut %q: Warren's network policies are allow lists; deny 0.0.0.0/0 and list what is allowed in allowOut", d)
		}
		denyAll = true
	}
	if !denyAll {
		if allowInternet == nil && len(n.AllowOut) == 0 {
			return nil, nil
		}
		return &warrenv1.NetworkPolicy{Mode: "open"}, nil
	}
	if len(n.AllowOut) == 0 {
		return &warrenv1.NetworkPolicy{Mode: "none"}, nil
	}
	pol := &warrenv1.NetworkPolicy{Mode: "allowlist"}
	for _, a := range n.AllowOut {
		r := &warrenv1.NetworkRule{}
		switch {
		case strings.Contains(a, "/"):
			r.Cidr = a
		case net.ParseIP(a) != nil:
			r.Cidr = a + "/32"
			if strings.Contains(a, ":") {
				r.Cidr = a + "/128"
			}
		default:
			r.Host = a
		}
		pol.Allow = append(pol.Allow, r)
	}
	return pol, nil
}

// setNetwork replaces the sandbox's egress policy (UpdateSandbox): new
// connections follow it at once and established ones it forbids are cut.
func (s *Server) setNetwork(w http.ResponseWriter, r *http.Request) {
	var body netConfig
	if err := decode(r, &body); err != nil {
		s.fail(w, err)
		return
	}
	pol, err := networkPolicy(nil, &body)
	if err != nil {
		s.fail(w, err)
		return
	}
	if pol == nil {
		// An empty body clears the egress configuration: E2B's default,
		// the internet.
		pol = &warrenv1.NetworkPolicy{Mode: "open"}
	}
	id := r.PathValue("id")
	if _, err := s.visible(r, id); err != nil {
		s.fail(w, err)
		return
	}
	if _, err := s.m.UpdateSandbox(r.Context(), &warrenv1.UpdateSandboxRequest{Id: id, Network: pol}); err != nil {
		s.fail(w, err)
		return
	}
	w.WriteHeader(http.StatusNoContent)
}

// fork is Warren's Fork: count copies of the sandbox (processes and
// files), each answered as a created sandbox. Warren forks through a
// checkpoint, so where the sandbox cannot be checkpointed (a node
// without CRIU) the call is refused as a whole (501).
func (s *Server) fork(w http.ResponseWriter, r *http.Request) {
	var body struct {
		Timeout int64 `json:"timeout"`
		Count   int32 `json:"count"`
	}
	if err := decode(r, &body); err != nil {
		s.fail(w, err)
		return
	}
	if body.Count == 0 {
		body.Count = 1
	}
	if body.Timeout < 0 {
		s.fail(w, errdefs.Invalidf("timeout %d: want seconds >= 0", body.Timeout))
		return
	}
	id := r.PathValue("id")
	if _, err := s.visible(r, id); err != nil {
		s.fail(w, err)
		return
	}
	// The checkpoint needs the source's agent idle: its open process
	// streams end (the commands run on; commands.connect follows them).
	s.open.end(id, 5*time.Second)
	s.ports.CloseAll(id)
	res, err := s.m.Fork(r.Context(), &warrenv1.ForkRequest{Id: id, Count: body.Count, TimeoutSeconds: body.Timeout})
	if err != nil {
		s.fail(w, err)
		return
	}
	type result struct {
		Sandbox created `json:"sandbox"`
	}
	out := make([]result, 0, len(res.GetSandboxes()))
	for _, sb := range res.GetSandboxes() {
		out = append(out, result{Sandbox: s.created(sb)})
	}
	writeJSON(w, http.StatusCreated, out)
}
