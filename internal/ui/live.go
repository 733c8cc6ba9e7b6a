package ui

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"math"
	"net/http"
	"strconv"
	"strings"
	"syscall"
	"time"

	warrenv1 "github.com/warrenrl/warren/gen/warren/v1"
)

// Live numbers go out as server-sent events whose data is one JSON
// object: keys name the elements (data-live="key") the script updates
// with textContent, so a value is never parsed as HTML.

// liveEvery is how often the live streams send.
const liveEvery = 2 * time.Second

// sse starts an event stream; send writes one event of v as JSON.
func sse(w http.ResponseWriter) (send func(event string, v any) error, ok bool) {
	fl, ok := w.(http.Flusher)
	if !ok {
		http.Error(w, "streaming unsupported", http.StatusInternalServerError)
		return nil, false
	}
	w.Header().Set("Content-Type", "text/event-stream")
	w.Header().Set("Cache-Control", "no-store")
	w.WriteHeader(http.StatusOK)
	fl.Flush()
	return func(event string, v any) error {
		// json.Marshal escapes <, > and & and never emits a newline,
		// so one data line carries the whole value.
		b, err := json.Marshal(v)
		if err != nil {
			return err
		}
		if event != "" {
			if _, err := fmt.Fprintf(w, "event: %s\n", event); err != nil {
				return err
			}
		}
		if _, err := fmt.Fprintf(w, "data: %s\n\n", b); err != nil {
			return err
		}
		fl.Flush()
		return nil
	}, true
}

// streamContext is the context of an event stream: it ends with the
// request or when the server begins to shut down.
func (s *site) streamContext(r *http.Request) (context.Context, context.CancelFunc) {
	ctx, cancel := context.WithCancel(r.Context())
	go func() {
		select {
		case <-s.stopping:
			cancel()
		case <-ctx.Done():
		}
	}()
	return ctx, cancel
}

// overviewLive streams the fleet's counts and rates.
func (s *site) overviewLive(w http.ResponseWriter, r *http.Request) {
	send, ok := sse(w)
	if !ok {
		return
	}
	ctx, cancel := s.streamContext(r)
	defer cancel()
	t := time.NewTicker(liveEvery)
	defer t.Stop()
	for {
		v := map[string]string{}
		if sbs, err := s.listAll(ctx, nil); err == nil {
			v["total"] = strconv.Itoa(len(sbs))
			states, backends := tally(sbs)
			for _, c := range states {
				v["state-"+c.Key] = strconv.Itoa(c.N)
			}
			for _, c := range backends {
				v["backend-"+c.Key] = strconv.Itoa(c.N)
			}
		}
		if nodes, err := s.c.NodeStatus(ctx); err == nil {
			for _, n := range nodes {
				v["node-"+n.GetName()+"-sandboxes"] = strconv.Itoa(int(n.GetSandboxes()))
				v["node-"+n.GetName()+"-load"] = strconv.FormatFloat(n.GetLoad(), 'f', 2, 64)
			}
		}
		if pts, _, has := s.ui.hist.snapshot(); has {
			v["creates-ps"], v["exec-ms"] = latestRates(pts)
		}
		if err := send("", v); err != nil {
			return
		}
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
	}
}

// sandboxLive streams one sandbox's use: CPU (a rate between two
// samples), memory, disk and pids.
func (s *site) sandboxLive(w http.ResponseWriter, r *http.Request) {
	id := r.PathValue("id")
	send, ok := sse(w)
	if !ok {
		return
	}
	ctx, cancel := s.streamContext(r)
	defer cancel()
	t := time.NewTicker(liveEvery)
	defer t.Stop()
	var prev *warrenv1.SandboxStatsResponse
	for {
		v := map[string]string{}
		if sb, err := s.c.Get(ctx, id); err == nil {
			v["state"] = stateName(sb.GetState())
		} else {
			v["state"] = "gone"
		}
		if st, err := s.c.SandboxStats(ctx, id); err == nil {
			v["mem"] = formatBytes(st.GetMemoryBytes())
			v["disk"] = formatBytes(st.GetDiskUsedBytes())
			v["pids"] = strconv.FormatUint(st.GetPids(), 10)
			v["cpu-seconds"] = strconv.FormatFloat(float64(st.GetCpuUsageNs())/1e9, 'f', 2, 64)
			if prev != nil {
				if dt := st.GetSampledAtUnixMs() - prev.GetSampledAtUnixMs(); dt > 0 {
					pct := float64(st.GetCpuUsageNs()-prev.GetCpuUsageNs()) / 1e6 / float64(dt) * 100
					v["cpu"] = strconv.FormatFloat(math.Max(pct, 0), 'f', 1, 64) + "%"
				}
			}
			prev = st
		}
		if err := send("", v); err != nil {
			return
		}
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
	}
}

// The terminal is a shell started with a PTY (StartProcess), its output
// followed with AttachProcess and streamed as events, its input written
// with WriteStdin. The script renders the output as text.

// terminalShell is what the terminal runs.
var terminalShell = []string{"/bin/sh", "-i"}

func (s *site) terminalStart(w http.ResponseWriter, r *http.Request) {
	id := r.PathValue("id")
	var req struct{ Rows, Cols uint32 }
	_ = json.NewDecoder(io.LimitReader(r.Body, 1024)).Decode(&req)
	if req.Rows == 0 || req.Rows > 500 {
		req.Rows = 24
	}
	if req.Cols == 0 || req.Cols > 500 {
		req.Cols = 80
	}
	p, err := s.c.StartProcess(r.Context(), &warrenv1.ExecRequest{SandboxId: id, Argv: terminalShell, Pty: true,
		Rows: req.Rows, Cols: req.Cols, Env: map[string]string{"TERM": "dumb"}})
	if err != nil {
		writeJSON(w, http.StatusBadGateway, map[string]string{"error": err.Error()})
		return
	}
	writeJSON(w, http.StatusOK, map[string]string{"process_id": p.GetProcessId()})
}

func (s *site) terminalStream(w http.ResponseWriter, r *http.Request) {
	id, pid := r.PathValue("id"), r.PathValue("pid")
	send, ok := sse(w)
	if !ok {
		return
	}
	ctx, cancel := s.streamContext(r)
	defer cancel()
	res, err := s.c.AttachProcess(ctx, &warrenv1.AttachProcessRequest{SandboxId: id, ProcessId: pid, StderrOffset: -1},
		func(ev *warrenv1.ProcessEvent) error {
			if out := ev.GetStdout(); out != nil && len(out.GetData()) > 0 {
				return send("", map[string]string{"out": strings.ToValidUTF8(string(out.GetData()), "\uFFFD")})
			}
			return nil
		})
	if err != nil {
		if r.Context().Err() != nil {
			// The browser went away: hang up the shell, as closing a
			// terminal window does (a reload starts another).
			hctx, hcancel := context.WithTimeout(context.WithoutCancel(r.Context()), 5*time.Second)
			defer hcancel()
			_ = s.c.SignalProcess(hctx, &warrenv1.SignalProcessRequest{SandboxId: id, ProcessId: pid, Signal: int32(syscall.SIGHUP), Group: true})
			return
		}
		_ = send("", map[string]string{"error": err.Error()})
		return
	}
	_ = send("", map[string]string{"exit": strconv.Itoa(int(res.GetExitCode()))})
}

func (s *site) terminalInput(w http.ResponseWriter, r *http.Request) {
	id, pid := r.PathValue("id"), r.PathValue("pid")
	var req struct {
		Data string `json:"data"`
	}
	if err := json.NewDecoder(io.LimitReader(r.Body, 64<<10)).Decode(&req); err != nil {
		writeJSON(w, http.StatusBadRequest, map[string]string{"error": "want {\"data\": \"...\"}"})
		return
	}
	if err := s.c.WriteStdin(r.Context(), &warrenv1.WriteStdinRequest{SandboxId: id, ProcessId: pid, Data: []byte(req.Data)}); err != nil {
		writeJSON(w, http.StatusBadGateway, map[string]string{"error": err.Error()})
		return
	}
	w.WriteHeader(http.StatusNoContent)
}

func writeJSON(w http.ResponseWriter, status int, v any) {
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(status)
	_ = json.NewEncoder(w).Encode(v)
}
