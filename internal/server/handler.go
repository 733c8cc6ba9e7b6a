package server

import (
	"context"
	"crypto/sha256"
	"crypto/subtle"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"os"
	"strconv"
	"strings"
	"time"

	"connectrpc.com/connect"
	"google.golang.org/protobuf/encoding/protojson"
	"google.golang.org/protobuf/proto"

	"github.com/warrenrl/warren/gen/warren/v1/warrenv1connect"
	"github.com/warrenrl/warren/internal/errdefs"
	"github.com/warrenrl/warren/internal/sandboxfs"
)

// Default request size limits.
const (
	DefaultReadMaxBytes    = 64 << 20  // one RPC message
	DefaultArchiveMaxBytes = 256 << 20 // one PUT /v1/sandboxes/{id}/archive body
	DefaultImageMaxBytes   = 16 << 30  // one PUT /v1/images/{name} or /v1/layers/{name} body
)

// HandlerOptions configure NewHandler.
type HandlerOptions struct {
	// Token, when set, is the bearer token every request but /healthz must
	// carry. Leave it empty on the unix socket, whose file mode is the
	// access control.
	Token string
	// Metrics serves GET /metrics; nil answers 404.
	Metrics http.Handler
	Logger  *slog.Logger
	// Size limits; zero selects the defaults above.
	ReadMaxBytes    int
	ArchiveMaxBytes int64
	ImageMaxBytes   int64
	// StallTimeout cuts an archive download whose client takes no data,
	// or an upload whose client sends none, for this long; zero selects
	// DefaultStallTimeout, a negative value disables the cutoff.
	StallTimeout time.Duration
	// UI, when set, serves /ui and everything below it, doing its own
	// authentication (UIFactory).
	UI http.Handler
}

func (o *HandlerOptions) setDefaults() {
	if o.Logger == nil {
		o.Logger = slog.Default()
	}
	if o.ReadMaxBytes <= 0 {
		o.ReadMaxBytes = DefaultReadMaxBytes
	}
	if o.ArchiveMaxBytes <= 0 {
		o.ArchiveMaxBytes = DefaultArchiveMaxBytes
	}
	if o.ImageMaxBytes <= 0 {
		o.ImageMaxBytes = DefaultImageMaxBytes
	}
	if o.StallTimeout == 0 {
		o.StallTimeout = DefaultStallTimeout
	}
}

// NewHandler returns the HTTP handler of the Warren API: the connect
// services (gRPC, gRPC-Web and Connect protocols) and the plain HTTP
// endpoints (archives, image and layer uploads, metrics, health).
func NewHandler(m Manager, o HandlerOptions) http.Handler {
	o.setDefaults()
	opts := []connect.HandlerOption{
		connect.WithReadMaxBytes(o.ReadMaxBytes),
		// Small messages are not worth compressing, even for clients
		// that accept gzip.
		connect.WithCompressMinBytes(4096),
		// The scope check runs inside the log, so refusals are logged.
		connect.WithInterceptors(&logInterceptor{log: o.Logger}, scope{m}),
		connect.WithRecover(func(ctx context.Context, spec connect.Spec, _ http.Header, p any) error {
			o.Logger.Error("panic in handler", "procedure", spec.Procedure, "panic", p)
			ce := connect.NewError(connect.CodeInternal, fmt.Errorf("internal error: %v", p))
			ce.Meta().Set(CategoryHeader, errdefs.Internal.String())
			return ce
		}),
	}
	mux := http.NewServeMux()
	mux.Handle(warrenv1connect.NewSandboxServiceHandler(sandboxService{m}, opts...))
	mux.Handle(warrenv1connect.NewImageServiceHandler(imageService{m}, opts...))
	mux.Handle(warrenv1connect.NewSystemServiceHandler(systemService{m}, opts...))

	h := &httpAPI{m: m, o: o}
	sc := scope{m}
	// The last column is what a harness may do with each (scope.go).
	for _, e := range []struct {
		pattern string
		fn      http.HandlerFunc
		harness access
	}{
		{"GET /v1/sandboxes/{id}/archive", h.getArchive, child},
		{"PUT /v1/sandboxes/{id}/archive", h.putArchive, child},
		{"GET /v1/sandboxes/{id}/ports/{port}", h.portTunnel, child},
		{"PUT /v1/images/{name...}", h.putImage, deny},
		{"PUT /v1/layers/{name...}", h.putLayer, deny},
		{"GET /healthz", func(w http.ResponseWriter, _ *http.Request) {
			w.Header().Set("Content-Type", "text/plain; charset=utf-8")
			_, _ = w.Write([]byte("ok\n"))
		}, anyone},
		{"GET /metrics", func(w http.ResponseWriter, r *http.Request) {
			if o.Metrics == nil {
				writeHTTPError(w, errdefs.NotFoundf("metrics are not enabled"))
				return
			}
			o.Metrics.ServeHTTP(w, r)
		}, deny},
	} {
		mux.HandleFunc(e.pattern, sc.scopeHTTP(e.harness, e.fn))
	}
	if o.UI != nil {
		mux.Handle(uiPrefix, o.UI)
		mux.Handle(uiPrefix+"/", o.UI)
	}
	if o.Token != "" {
		return requireToken(o.Token, o.UI != nil, mux)
	}
	return mux
}

// requireToken rejects requests without "Authorization: Bearer <token>",
// except the health check and, when ui is set, the dashboard, which
// checks the token itself (from a cookie). RPCs get a protocol-correct
// Unauthenticated error, everything else a JSON 401.
func requireToken(token string, ui bool, next http.Handler) http.Handler {
	want := sha256.Sum256([]byte(token))
	ew := connect.NewErrorWriter()
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path == "/healthz" || ui && isUIPath(r.URL.Path) {
			next.ServeHTTP(w, r)
			return
		}
		got, ok := bearerToken(r.Header.Get("Authorization"))
		sum := sha256.Sum256([]byte(got))
		if ok && subtle.ConstantTimeCompare(sum[:], want[:]) == 1 {
			next.ServeHTTP(w, r)
			return
		}
		msg := "missing bearer token"
		if ok {
			msg = "invalid bearer token"
		}
		w.Header().Set("WWW-Authenticate", `Bearer realm="warren"`)
		if strings.HasPrefix(r.URL.Path, "/warren.v1.") && ew.IsSupported(r) {
			ce := connect.NewError(connect.CodeUnauthenticated, errors.New(msg))
			ce.Meta().Set(CategoryHeader, errdefs.Unauthenticated.String())
			_ = ew.Write(w, r, ce)
			return
		}
		writeJSONError(w, http.StatusUnauthorized, JSONError{
			Code: connect.CodeUnauthenticated.String(), Message: msg, Category: errdefs.Unauthenticated.String(),
		})
	})
}

func bearerToken(h string) (string, bool) {
	scheme, tok, ok := strings.Cut(strings.TrimSpace(h), " ")
	if !ok || !strings.EqualFold(scheme, "Bearer") {
		return "", false
	}
	tok = strings.TrimSpace(tok)
	return tok, tok != ""
}

// httpAPI serves the plain HTTP endpoints.
type httpAPI struct {
	m Manager
	o HandlerOptions
}

// lazyWriter sends the success headers on the first write, so that an
// error before any output can still become a JSON error response.
type lazyWriter struct {
	w       http.ResponseWriter
	out     *stallWriter // w's body, cut when the client stalls
	ctype   string
	started bool
}

func (l *lazyWriter) start() {
	if !l.started {
		l.started = true
		l.w.Header().Set("Content-Type", l.ctype)
		l.w.WriteHeader(http.StatusOK)
	}
}

func (l *lazyWriter) Write(p []byte) (int, error) {
	l.start()
	return l.out.Write(p)
}

func (h *httpAPI) getArchive(w http.ResponseWriter, r *http.Request) {
	id, path := r.PathValue("id"), r.URL.Query().Get("path")
	if path == "" {
		writeHTTPError(w, errdefs.Invalidf("query parameter path is required"))
		return
	}
	var o sandboxfs.TarOptions
	switch s := r.URL.Query().Get("sparse"); s {
	case "", "0", "false":
	case "1", "true":
		// Holes as PAX sparse entries: for clients whose tar reader
		// knows them (the SDKs' download-to-disk calls).
		o.Sparse = true
	default:
		writeHTTPError(w, errdefs.Invalidf("query parameter sparse: %q is not 0, 1, false or true", s))
		return
	}
	lw := &lazyWriter{w: w, out: newStallWriter(w, h.o.StallTimeout), ctype: "application/x-tar"}
	err := h.m.TarOut(r.Context(), id, path, lw, o)
	if err == nil {
		lw.start()
		err = lw.out.Flush()
	}
	if err != nil {
		if !lw.started {
			writeHTTPError(w, err)
			return
		}
		// Headers are gone: break the response so the client sees a
		// failed transfer rather than a short archive.
		h.o.Logger.Warn("archive download failed mid-stream", "sandbox", id, "path", path, "err", err,
			"stall_timeout", h.o.StallTimeout)
		panic(http.ErrAbortHandler)
	}
}

func (h *httpAPI) putArchive(w http.ResponseWriter, r *http.Request) {
	id, path := r.PathValue("id"), r.URL.Query().Get("path")
	if path == "" {
		writeHTTPError(w, errdefs.Invalidf("query parameter path is required"))
		return
	}
	if !tarContentType(r.Header.Get("Content-Type")) {
		writeHTTPError(w, errdefs.Invalidf("unsupported content type %q: want application/x-tar", r.Header.Get("Content-Type")))
		return
	}
	body := newStallReader(w, http.MaxBytesReader(w, r.Body, h.o.ArchiveMaxBytes), h.o.StallTimeout)
	var err error
	if rec, ok := h.m.(StepRecorder); ok {
		var seq uint64
		if s := r.URL.Query().Get("seq"); s != "" {
			if seq, err = strconv.ParseUint(s, 10, 64); err != nil {
				writeHTTPError(w, errdefs.Invalidf("bad query parameter seq %q", s))
				return
			}
		}
		var got uint64
		var replayed bool
		got, replayed, err = rec.TarInStep(r.Context(), id, path, r.URL.Query().Get("session"), seq, body)
		if err == nil && got > 0 {
			w.Header().Set(HeaderTrajectorySeq, strconv.FormatUint(got, 10))
			w.Header().Set(HeaderTrajectoryReplayed, strconv.FormatBool(replayed))
		}
	} else {
		err = h.m.TarIn(r.Context(), id, path, body)
	}
	if err != nil {
		writeHTTPError(w, stalled(tooLarge(err, h.o.ArchiveMaxBytes), h.o.StallTimeout))
		return
	}
	w.WriteHeader(http.StatusNoContent)
}

func (h *httpAPI) putImage(w http.ResponseWriter, r *http.Request) {
	h.putTar(w, r, func(ctx context.Context, name string, body io.Reader) (proto.Message, error) {
		return h.m.ImportImageTar(ctx, name, body)
	})
}

func (h *httpAPI) putLayer(w http.ResponseWriter, r *http.Request) {
	h.putTar(w, r, func(ctx context.Context, name string, body io.Reader) (proto.Message, error) {
		return h.m.BuildLayerTar(ctx, name, body)
	})
}

// putTar serves an upload of a (possibly gzip-compressed) tarball to
// {name}, answering the resulting message as JSON.
func (h *httpAPI) putTar(w http.ResponseWriter, r *http.Request, fn func(ctx context.Context, name string, body io.Reader) (proto.Message, error)) {
	name := r.PathValue("name")
	if !tarContentType(r.Header.Get("Content-Type")) && !strings.HasPrefix(r.Header.Get("Content-Type"), "application/gzip") {
		writeHTTPError(w, errdefs.Invalidf("unsupported content type %q: want application/x-tar", r.Header.Get("Content-Type")))
		return
	}
	body := newStallReader(w, http.MaxBytesReader(w, r.Body, h.o.ImageMaxBytes), h.o.StallTimeout)
	msg, err := fn(r.Context(), name, body)
	if err != nil {
		writeHTTPError(w, stalled(tooLarge(err, h.o.ImageMaxBytes), h.o.StallTimeout))
		return
	}
	data, err := protojson.Marshal(msg)
	if err != nil {
		writeHTTPError(w, errdefs.Internalf("encode response: %v", err))
		return
	}
	w.Header().Set("Content-Type", "application/json")
	_, _ = w.Write(data)
}

func tarContentType(ct string) bool {
	ct, _, _ = strings.Cut(ct, ";")
	switch strings.TrimSpace(strings.ToLower(ct)) {
	case "", "application/x-tar", "application/tar", "application/octet-stream":
		return true
	}
	return false
}

// tooLarge turns a body-limit failure, whatever category the manager gave
// it, into an Exhausted error that names the limit.
func tooLarge(err error, limit int64) error {
	var mbe *http.MaxBytesError
	if errors.As(err, &mbe) {
		return errdefs.Exhaustedf("request body larger than %d bytes", limit)
	}
	return err
}

// stalled turns the read deadline of a stalled upload, whatever category
// the manager gave it, into a DeadlineExceeded error that says so.
func stalled(err error, d time.Duration) error {
	if errors.Is(err, os.ErrDeadlineExceeded) {
		return errdefs.New(errdefs.DeadlineExceeded, "upload stalled: the client sent nothing for %v (warren serve --stall-timeout)", d)
	}
	return err
}

// logInterceptor logs failed calls: internal errors at error level, the
// rest at debug level.
type logInterceptor struct{ log *slog.Logger }

func (l *logInterceptor) done(ctx context.Context, procedure string, start time.Time, err error) {
	if err == nil {
		l.log.Log(ctx, slog.LevelDebug-4, "rpc", "procedure", procedure, "duration", time.Since(start))
		return
	}
	level := slog.LevelDebug
	if code := connect.CodeOf(err); code == connect.CodeInternal || code == connect.CodeUnknown {
		level = slog.LevelError
	}
	l.log.Log(ctx, level, "rpc failed", "procedure", procedure, "code", connect.CodeOf(err).String(), "err", err, "duration", time.Since(start))
}

func (l *logInterceptor) WrapUnary(next connect.UnaryFunc) connect.UnaryFunc {
	return func(ctx context.Context, req connect.AnyRequest) (connect.AnyResponse, error) {
		start := time.Now()
		res, err := next(ctx, req)
		l.done(ctx, req.Spec().Procedure, start, err)
		return res, err
	}
}

func (l *logInterceptor) WrapStreamingClient(next connect.StreamingClientFunc) connect.StreamingClientFunc {
	return next
}

func (l *logInterceptor) WrapStreamingHandler(next connect.StreamingHandlerFunc) connect.StreamingHandlerFunc {
	return func(ctx context.Context, conn connect.StreamingHandlerConn) error {
		start := time.Now()
		err := next(ctx, conn)
		l.done(ctx, conn.Spec().Procedure, start, err)
		return err
	}
}
