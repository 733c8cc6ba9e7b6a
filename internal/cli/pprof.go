package cli

import (
	"context"
	"errors"
	"log/slog"
	"net/http"
	"net/http/pprof"
	"time"

	"github.com/warrenrl/warren/internal/server"
)

// servePprof serves Go's profiling endpoints (/debug/pprof/) on addr until
// ctx ends and returns the address it listens on. It has no
// authentication: give it a loopback address.
func servePprof(ctx context.Context, addr string, log *slog.Logger) (string, error) {
	ln, err := server.ListenTCP(addr)
	if err != nil {
		return "", err
	}
	mux := http.NewServeMux()
	mux.HandleFunc("/debug/pprof/", pprof.Index)
	mux.HandleFunc("/debug/pprof/cmdline", pprof.Cmdline)
	mux.HandleFunc("/debug/pprof/profile", pprof.Profile)
	mux.HandleFunc("/debug/pprof/symbol", pprof.Symbol)
	mux.HandleFunc("/debug/pprof/trace", pprof.Trace)
	srv := &http.Server{Handler: mux, ReadHeaderTimeout: 10 * time.Second}
	go func() {
		<-ctx.Done()
		_ = srv.Close()
	}()
	go func() {
		if err := srv.Serve(ln); err != nil && !errors.Is(err, http.ErrServerClosed) {
			log.Warn("pprof server stopped", "err", err)
		}
	}()
	log.Info("serving profiles", "addr", ln.Addr().String())
	return ln.Addr().String(), nil
}
