package daemon

import (
	"crypto/rand"
	"crypto/sha256"
	"encoding/base32"
	"math"
	"path"
	"regexp"
	"runtime"
	"sort"
	"strings"
	"time"

	warrenv1 "github.com/warrenrl/warren/gen/warren/v1"
	"github.com/warrenrl/warren/internal/backend"
	"github.com/warrenrl/warren/internal/errdefs"
	"github.com/warrenrl/warren/internal/etcfiles"
	"github.com/warrenrl/warren/internal/image"
	"github.com/warrenrl/warren/internal/netpolicy"
	"github.com/warrenrl/warren/internal/rlimit"
)

// Limits of create requests.
const (
	MinMemoryBytes  = 4 << 20
	MaxMemoryBytes  = 1 << 40 // 1 TiB
	MinDiskBytes    = 16 << 20
	MaxDiskBytes    = 1 << 44 // 16 TiB
	MinPids         = 8
	MaxPids         = 4 << 20 // the kernel's pid_max ceiling
	maxLabels       = 64
	maxLabelKey     = 128
	maxLabelValue   = 1024
	maxEnvEntries   = 1024
	maxEnvBytes     = 1 << 20
	maxPathLen      = 4096
	defaultPATH     = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"
	generatedIDLen  = 12
	maxArgvBytes    = 1 << 20
	maxCPUCoresHard = 64 // cpu_millis may ask for max(64, host cores) cores
	// MaxExtraLayers bounds the named layers of one sandbox: with its
	// image's layer(s), one overlay mount takes at most 40 lower layers.
	MaxExtraLayers = 39
)

var idRE = regexp.MustCompile(`^[a-z0-9][a-z0-9_.-]{0,62}$`)

// ValidID reports whether id is a valid sandbox id.
func ValidID(id string) bool { return idRE.MatchString(id) }

var idEncoding = base32.NewEncoding("abcdefghijklmnopqrstuvwxyz234567").WithPadding(base32.NoPadding)

// newID returns a random sandbox id: the node's tag (in a cluster)
// followed by 12 characters from [a-z2-7] (60 bits).
func (m *Manager) newID() string { return m.cfg.NodeTag + newID() }

// IDForKey is the id of the sandbox a create with idempotency key makes
// on the node of tag when it names no id: the tag and 12 characters of the
// key's SHA-256, so that any gateway finds it again from the key alone.
func IDForKey(tag, key string) string {
	h := sha256.Sum256([]byte(key))
	return tag + idEncoding.EncodeToString(h[:])[:generatedIDLen]
}

// newID returns a random sandbox id of 12 characters from [a-z2-7]
// (60 bits).
func newID() string {
	var b [8]byte
	_, _ = rand.Read(b[:])
	return idEncoding.EncodeToString(b[:])[:generatedIDLen]
}

// maxCPUMillis is the largest cpu_millis a sandbox may ask for.
func maxCPUMillis() int64 {
	return int64(max(maxCPUCoresHard, runtime.NumCPU())) * 1000
}

// createParams is a validated create request with defaults applied.
type createParams struct {
	id, image, backend string
	resources          *warrenv1.Resources
	timeout            time.Duration
	env                map[string]string
	workdir, hostname  string
	user               string
	labels             map[string]string
	layers             []string // named layers (or digests), bottom first
	rlimits            []rlimit.Limit
	network            netpolicy.Policy
	qos                backend.QoS
}

func (m *Manager) validateCreate(req *warrenv1.CreateRequest) (createParams, error) {
	p := createParams{
		id:       req.GetId(),
		image:    req.GetImage(),
		backend:  req.GetBackend(),
		env:      req.GetEnv(),
		workdir:  req.GetWorkdir(),
		hostname: req.GetHostname(),
		user:     req.GetUser(),
		labels:   req.GetLabels(),
		layers:   req.GetLayers(),
	}
	if n := req.GetNode(); n != "" && n != m.cfg.NodeName {
		return p, errdefs.Invalidf("create asks for node %q: this is node %q", n, m.cfg.NodeName)
	}
	if p.id != "" && !ValidID(p.id) {
		return p, errdefs.Invalidf("invalid sandbox id %q: want [a-z0-9][a-z0-9_.-]{0,62}", p.id)
	}
	if k := req.GetIdempotencyKey(); len(k) > maxIdempotencyKey {
		return p, errdefs.Invalidf("idempotency_key longer than %d bytes", maxIdempotencyKey)
	} else if k != "" && p.id == "" {
		p.id = IDForKey(m.cfg.NodeTag, k)
	}
	if p.image == "" {
		return p, errdefs.Invalidf("image is required")
	}
	if err := image.ValidName(p.image); err != nil {
		return p, err
	}
	if len(p.layers) > MaxExtraLayers {
		return p, errdefs.Invalidf("too many layers: %d (at most %d on top of the image)", len(p.layers), MaxExtraLayers)
	}
	for _, l := range p.layers {
		if err := image.ValidName(l); err != nil {
			return p, errdefs.Invalidf("invalid layer name %q: want [a-z0-9][a-z0-9._:/-]{0,127} or sha256:<hex>", l)
		}
	}
	if p.backend == "" {
		p.backend = DefaultBackend
	}
	if _, ok := m.cfg.Backends[p.backend]; !ok {
		return p, errdefs.Invalidf("unknown backend %q (have %s)", p.backend, strings.Join(m.backendNames(), ", "))
	}
	r := req.GetResources()
	res := &warrenv1.Resources{CpuMillis: r.GetCpuMillis(), MemoryBytes: r.GetMemoryBytes(), PidsMax: r.GetPidsMax(), DiskBytes: r.GetDiskBytes()}
	if err := checkCPU(res.CpuMillis); err != nil {
		return p, err
	}
	if err := checkMemory(res.MemoryBytes); err != nil {
		return p, err
	}
	if err := checkPids(res.PidsMax); err != nil {
		return p, err
	}
	if res.DiskBytes < 0 || (res.DiskBytes > 0 && res.DiskBytes < MinDiskBytes) || res.DiskBytes > MaxDiskBytes {
		return p, errdefs.Invalidf("disk_bytes %d out of range [%d, %d] (0 = default)", res.DiskBytes, MinDiskBytes, int64(MaxDiskBytes))
	}
	if res.DiskBytes == 0 {
		res.DiskBytes = m.cfg.DefaultDiskBytes
	}
	if res.MemoryBytes == 0 {
		res.MemoryBytes = m.cfg.DefaultMemoryBytes
	}
	if res.PidsMax == 0 {
		res.PidsMax = m.cfg.DefaultPids
	}
	p.resources = res

	t, err := m.lifetime(req.GetTimeoutSeconds())
	if err != nil {
		return p, err
	}
	p.timeout = t
	if err := validateEnv(p.env); err != nil {
		return p, err
	}
	if p.workdir != "" {
		if err := validateAbsPath("workdir", p.workdir); err != nil {
			return p, err
		}
		p.workdir = path.Clean(p.workdir)
	}
	if err := checkUserSpec(p.user); err != nil {
		return p, err
	}
	if p.hostname != "" {
		if err := etcfiles.CheckHostname(p.hostname); err != nil {
			return p, err
		}
	}
	if err := checkLabels(p.labels); err != nil {
		return p, err
	}
	if p.rlimits, err = rlimitsOf(req.GetRlimits()); err != nil {
		return p, err
	}
	if p.network, err = networkPolicy("network", req.GetNetwork()); err != nil {
		return p, err
	}
	if p.qos, err = qosOf(req.GetQos(), req.GetQosCpus()); err != nil {
		return p, err
	}
	return p, nil
}

// rlimitsOf validates a create request's rlimits and returns every limit
// of the sandbox: the request's over the defaults, none above what this
// daemon may grant (internal/rlimit).
func rlimitsOf(req []*warrenv1.Rlimit) ([]rlimit.Limit, error) {
	ls := make([]rlimit.Limit, 0, len(req))
	for _, r := range req {
		soft, err := rlimitValue(r.GetName(), "soft", r.GetSoft())
		if err != nil {
			return nil, err
		}
		hard, err := rlimitValue(r.GetName(), "hard", r.GetHard())
		if err != nil {
			return nil, err
		}
		ls = append(ls, rlimit.Limit{Name: r.GetName(), Soft: soft, Hard: hard})
	}
	return rlimit.Resolve(ls, rlimit.Ceiling)
}

// rlimitValue maps an API value to the kernel's: -1 is unlimited.
func rlimitValue(name, which string, v int64) (uint64, error) {
	switch {
	case v == -1:
		return rlimit.Infinity, nil
	case v < 0:
		return 0, errdefs.Invalidf("rlimit %s: %s limit %d is negative (-1 = unlimited)", name, which, v)
	}
	return uint64(v), nil
}

// rlimitProtos is the API form of limits (Sandbox.rlimits).
func rlimitProtos(ls []rlimit.Limit) []*warrenv1.Rlimit {
	out := make([]*warrenv1.Rlimit, len(ls))
	for i, l := range ls {
		out[i] = &warrenv1.Rlimit{Name: l.Name, Soft: apiRlimit(l.Soft), Hard: apiRlimit(l.Hard)}
	}
	return out
}

func apiRlimit(v uint64) int64 {
	if v > math.MaxInt64 {
		return -1 // only Infinity: the kernel takes nothing else that large
	}
	return int64(v)
}

// checkCPU, checkMemory and checkPids validate limits of Create and
// UpdateSandbox (0: no quota for CPU, the node default for the others).
func checkCPU(n int64) error {
	switch {
	case n < 0 || n > maxCPUMillis():
		return errdefs.Invalidf("cpu_millis %d out of range [0, %d]", n, maxCPUMillis())
	case n > 0 && n < 10:
		return errdefs.Invalidf("cpu_millis %d too small: at least 10 (one hundredth of a core)", n)
	}
	return nil
}

func checkMemory(n int64) error {
	if n < 0 || (n > 0 && n < MinMemoryBytes) || n > MaxMemoryBytes {
		return errdefs.Invalidf("memory_bytes %d out of range [%d, %d] (0 = default)", n, MinMemoryBytes, int64(MaxMemoryBytes))
	}
	return nil
}

func checkPids(n int64) error {
	if n < 0 || (n > 0 && n < MinPids) || n > MaxPids {
		return errdefs.Invalidf("pids_max %d out of range [%d, %d] (0 = default)", n, MinPids, MaxPids)
	}
	return nil
}

func checkLabels(labels map[string]string) error {
	if len(labels) > maxLabels {
		return errdefs.Invalidf("too many labels: %d > %d", len(labels), maxLabels)
	}
	for k, v := range labels {
		if k == "" || len(k) > maxLabelKey || len(v) > maxLabelValue {
			return errdefs.Invalidf("invalid label %q: keys 1-%d bytes, values up to %d", k, maxLabelKey, maxLabelValue)
		}
	}
	return nil
}

// lifetime validates a timeout in seconds: 0 is the node default.
func (m *Manager) lifetime(sec int64) (time.Duration, error) {
	switch {
	case sec < 0:
		return 0, errdefs.Invalidf("timeout_seconds %d is negative", sec)
	case sec == 0:
		return m.cfg.DefaultTimeout, nil
	case sec > int64(m.cfg.MaxTimeout/time.Second):
		return 0, errdefs.Invalidf("timeout_seconds %d exceeds the maximum of %d", sec, int64(m.cfg.MaxTimeout/time.Second))
	}
	return time.Duration(sec) * time.Second, nil
}

func validateEnv(env map[string]string) error {
	if len(env) > maxEnvEntries {
		return errdefs.Invalidf("too many environment variables: %d > %d", len(env), maxEnvEntries)
	}
	size := 0
	for k, v := range env {
		if k == "" || strings.ContainsAny(k, "=\x00") || strings.ContainsRune(v, 0) {
			return errdefs.Invalidf("invalid environment variable %q", k)
		}
		size += len(k) + len(v) + 2
	}
	if size > maxEnvBytes {
		return errdefs.Invalidf("environment too large: %d bytes > %d", size, maxEnvBytes)
	}
	return nil
}

func validateAbsPath(what, p string) error {
	if !strings.HasPrefix(p, "/") || len(p) > maxPathLen || strings.ContainsRune(p, 0) {
		return errdefs.Invalidf("%s %q must be an absolute path", what, p)
	}
	return nil
}

// imageEnv merges a create request's env over the env of the image's
// config ("K=V" entries; malformed ones are skipped).
func imageEnv(cfg *image.Config, req map[string]string) map[string]string {
	if cfg == nil || len(cfg.Env) == 0 {
		return req
	}
	out := make(map[string]string, len(cfg.Env)+len(req))
	for _, kv := range cfg.Env {
		k, v, ok := strings.Cut(kv, "=")
		if !ok || k == "" || strings.ContainsRune(kv, 0) {
			continue
		}
		out[k] = v
	}
	for k, v := range req {
		out[k] = v
	}
	return out
}

// defaultLANG is the locale of processes whose image and request set none:
// C.UTF-8 is built into glibc since 2.35 (Debian 12 has 2.36) and musl,
// so it needs no locale files, and programs that would otherwise run in
// the ASCII "C" locale (git, gcc messages, Perl, Java) read and write
// UTF-8 as they do on a normal machine.
const defaultLANG = "C.UTF-8"

// mergeEnv builds a process environment: the sandbox env, then the request
// env over it, plus PATH and HOME when neither sets them, and LANG when
// neither sets LANG or any LC_* variable. Nothing comes from the daemon's
// own environment (its TZ or LANG would make a sandbox depend on how the
// daemon was started). Sorted by name.
func mergeEnv(sandboxEnv, reqEnv map[string]string, home string) []string {
	env := make(map[string]string, len(sandboxEnv)+len(reqEnv)+2)
	for k, v := range sandboxEnv {
		env[k] = v
	}
	for k, v := range reqEnv {
		env[k] = v
	}
	if _, ok := env["PATH"]; !ok {
		env["PATH"] = defaultPATH
	}
	if _, ok := env["HOME"]; !ok {
		if home == "" {
			home = "/"
		}
		env["HOME"] = home
	}
	if !hasLocale(env) {
		env["LANG"] = defaultLANG
	}
	out := make([]string, 0, len(env))
	for k, v := range env {
		out = append(out, k+"="+v)
	}
	sort.Strings(out)
	return out
}

// hasLocale reports whether env chooses a locale: LANG or any LC_*
// (LC_ALL, LC_CTYPE, ...), which a default LANG would partly override.
func hasLocale(env map[string]string) bool {
	if _, ok := env["LANG"]; ok {
		return true
	}
	for k := range env {
		if strings.HasPrefix(k, "LC_") {
			return true
		}
	}
	return false
}

// envList turns a sandbox env map into the sorted "K=V" list of
// backend.Spec.Env.
func envList(env map[string]string) []string {
	out := make([]string, 0, len(env))
	for k, v := range env {
		out = append(out, k+"="+v)
	}
	sort.Strings(out)
	return out
}

// argvOf returns the argv of an exec request: argv, or /bin/sh -c shell.
func argvOf(req *warrenv1.ExecRequest) ([]string, error) {
	argv, shell := req.GetArgv(), req.GetShell()
	switch {
	case len(argv) > 0 && shell != "":
		return nil, errdefs.Invalidf("set either argv or shell, not both")
	case shell != "":
		if strings.ContainsRune(shell, 0) {
			return nil, errdefs.Invalidf("shell command contains a NUL byte")
		}
		return []string{"/bin/sh", "-c", shell}, nil
	case len(argv) == 0:
		return nil, errdefs.Invalidf("argv or shell is required")
	}
	if argv[0] == "" {
		return nil, errdefs.Invalidf("argv[0] is empty")
	}
	size := 0
	for _, a := range argv {
		if strings.ContainsRune(a, 0) {
			return nil, errdefs.Invalidf("argv contains a NUL byte")
		}
		size += len(a) + 1
	}
	if size > maxArgvBytes {
		return nil, errdefs.Invalidf("argv too large: %d bytes > %d", size, maxArgvBytes)
	}
	return argv, nil
}

// outputLimit validates output_limit_bytes: 0 is the 1 MiB default.
func outputLimit(n int64) (int64, error) {
	switch {
	case n < 0 || n > MaxOutputLimit:
		return 0, errdefs.Invalidf("output_limit_bytes %d out of range [0, %d]", n, MaxOutputLimit)
	case n == 0:
		return DefaultOutputLimit, nil
	}
	return n, nil
}

func (m *Manager) backendNames() []string {
	names := make([]string, 0, len(m.cfg.Backends))
	for n := range m.cfg.Backends {
		names = append(names, n)
	}
	sort.Strings(names)
	return names
}
