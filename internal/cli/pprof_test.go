package cli

import (
	"context"
	"io"
	"log/slog"
	"net/http"
	"strings"
	"testing"
	"time"
)

func TestServePprof(t *testing.T) {
	ctx, cancel := context.WithCancel(context.Background())
	addr, err := servePprof(ctx, "127.0.0.1:0", slog.New(slog.NewTextHandler(io.Discard, nil)))
	if err != nil {
		t.Fatal(err)
	}
	resp, err := http.Get("http://" + addr + "/debug/pprof/goroutine?debug=1")
	if err != nil {
		t.Fatal(err)
	}
	body, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if resp.StatusCode != http.StatusOK || !strings.Contains(string(body), "goroutine profile") {
		t.Fatalf("status %d: %.200s", resp.StatusCode, body)
	}
	cancel()
	// Closed with the context: a new connection is refused (retry while
	// the close goroutine runs).
	for i := 0; ; i++ {
		if _, err := http.Get("http://" + addr + "/debug/pprof/"); err != nil {
			break
		}
		if i == 100 {
			t.Fatal("pprof server still answers after its context ended")
		}
		http.DefaultClient.CloseIdleConnections()
		time.Sleep(10 * time.Millisecond)
	}
}
