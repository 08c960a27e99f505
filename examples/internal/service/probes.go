package service

import (
	"encoding/json"
	"fmt"
	"net"
	"net/http"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promhttp"
)

// Probes is a binary's --metrics-addr server, listening from the start of the process: while
// the binary waits for what it needs before it can consume — its database (up to
// pgstart.Within, 60 s, during a promotion), its topics (up to 30 s against unreachable
// brokers), its migrations — /healthz answers 200 (the process runs: a liveness probe must
// not restart a process that is waiting, or a failover turns into a restart loop), /readyz
// 503 with {"ready":false,"starting":true,"reason":STAGE}, and /metrics what the registry
// holds so far. Run hands it the consumer's handler (Serve), and from then on it answers as
// Handler does. Before, nothing listened until the consumer existed: "connection refused"
// for every probe during the wait.
type Probes struct {
	srv *http.Server

	mu    sync.Mutex
	stage string       // what the binary waits for, while h is nil
	h     http.Handler // the consumer's handler, once Serve is called
}

// StartProbes listens on addr ("": no server; a nil *Probes is valid and does nothing) and
// serves reg on /metrics until Serve. A port already in use is an error at once, before any
// wait.
func StartProbes(addr string, reg *prometheus.Registry) (*Probes, error) {
	if addr == "" {
		return nil, nil
	}
	ln, err := net.Listen("tcp", addr)
	if err != nil {
		return nil, fmt.Errorf("--metrics-addr: %w", err)
	}
	p := &Probes{stage: "starting"}
	metrics := http.NotFoundHandler()
	if reg != nil {
		metrics = promhttp.HandlerFor(reg, promhttp.HandlerOpts{})
	}
	p.srv = &http.Server{Handler: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		p.mu.Lock()
		h, stage := p.h, p.stage
		p.mu.Unlock()
		if h != nil {
			h.ServeHTTP(w, r)
			return
		}
		switch r.URL.Path {
		case "/healthz":
			fmt.Fprintln(w, "ok")
		case "/readyz":
			body, _ := json.Marshal(map[string]any{"ready": false, "starting": true, "reason": stage})
			w.Header().Set("Content-Type", "application/json")
			w.WriteHeader(http.StatusServiceUnavailable)
			_, _ = w.Write(append(body, '\n'))
		case "/metrics":
			metrics.ServeHTTP(w, r)
		default:
			http.NotFound(w, r)
		}
	}), ReadHeaderTimeout: 5 * time.Second}
	go func() { _ = p.srv.Serve(ln) }() // http.ErrServerClosed after Close

	return p, nil
}

// Stage names what the binary waits for now, for /readyz's reason until Serve.
func (p *Probes) Stage(stage string) {
	if p == nil {
		return
	}
	p.mu.Lock()
	p.stage = stage
	p.mu.Unlock()
}

// Serve answers every request with h from now on.
func (p *Probes) Serve(h http.Handler) {
	if p == nil {
		return
	}
	p.mu.Lock()
	p.h = h
	p.mu.Unlock()
}

// Close stops the server.
func (p *Probes) Close() {
	if p == nil {
		return
	}
	_ = p.srv.Close()
}
