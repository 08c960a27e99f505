package main

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promhttp"
	"go.uber.org/zap"
)

// healthServer is the relay's --health-addr server, listening from the start of the command
// so that a probe gets an answer while the database is waited for (pgstart.Within: a
// promotion) and the migrations run: /healthz 200 (the process runs: a liveness probe must not
// restart a relay that waits, or a failover becomes a restart loop), /readyz 503 with
// {"ready":false,"starting":true,"reason":STAGE}, /metrics the registry. Once the relay runs
// (running), /readyz is the relay's own readiness and /healthz 503 after the relay stopped.
// A nil *healthServer (no --health-addr) does nothing.
type healthServer struct {
	srv *http.Server

	mu     sync.Mutex
	reason string           // what the command waits for, until running
	readyz http.HandlerFunc // the relay's readiness, once running
	done   <-chan struct{}  // closed when the relay has stopped
}

// serveHealth listens on --health-addr (nil when it is empty); a port in use is an error at
// once, before any wait.
func (c *RelayCmd) serveHealth(reg *prometheus.Registry, log *zap.Logger) (*healthServer, error) {
	if c.HealthAddr == "" {
		return nil, nil
	}
	ln, err := listen("health-addr", c.HealthAddr)
	if err != nil {
		return nil, err
	}
	h := &healthServer{reason: "starting"}
	mux := http.NewServeMux()
	mux.HandleFunc("/healthz", func(w http.ResponseWriter, _ *http.Request) {
		h.mu.Lock()
		done := h.done
		h.mu.Unlock()
		select {
		case <-done: // nil until running: never ready to receive
			http.Error(w, "relay stopped\n", http.StatusServiceUnavailable)
		default:
			fmt.Fprintln(w, "ok")
		}
	})
	mux.HandleFunc("/readyz", func(w http.ResponseWriter, r *http.Request) {
		h.mu.Lock()
		readyz, reason := h.readyz, h.reason
		h.mu.Unlock()
		if readyz != nil {
			readyz(w, r)
			return
		}
		body, _ := json.Marshal(map[string]any{"ready": false, "starting": true, "reason": reason})
		w.Header().Set("Content-Type", "application/json")
		w.WriteHeader(http.StatusServiceUnavailable)
		_, _ = w.Write(append(body, '\n'))
	})
	mux.Handle("/metrics", promhttp.HandlerFor(reg, promhttp.HandlerOpts{}))
	h.srv = &http.Server{Handler: mux, ReadHeaderTimeout: 5 * time.Second}
	go func() {
		if err := h.srv.Serve(ln); err != nil && !errors.Is(err, http.ErrServerClosed) {
			log.Error("health endpoint stopped", zap.Error(err))
		}
	}()
	return h, nil
}

// stage names what the command waits for now, /readyz's reason until running.
func (h *healthServer) stage(reason string) {
	if h == nil {
		return
	}
	h.mu.Lock()
	h.reason = reason
	h.mu.Unlock()
}

// running hands /readyz to the relay's readiness; done closes when the relay has stopped.
func (h *healthServer) running(readyz http.HandlerFunc, done <-chan struct{}) {
	if h == nil {
		return
	}
	h.mu.Lock()
	h.readyz, h.done = readyz, done
	h.mu.Unlock()
}

// close shuts the server down, waiting at most 2 s for requests under way.
func (h *healthServer) close() {
	if h == nil {
		return
	}
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
	defer cancel()
	_ = h.srv.Shutdown(ctx)
}
