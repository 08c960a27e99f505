// Package service runs a kafkatx consumer the way the example binaries do: with the outbox
// relay in-process (it publishes what the handlers and the dead letters write to the outbox)
// and an optional exit once idle, as EXAMPLES.md defines it.
package service

import (
	"context"
	"fmt"
	"net"
	"net/http"
	"time"

	"github.com/confluentinc/confluent-kafka-go/v2/kafka"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promhttp"
	"go.uber.org/zap"

	"github.com/kafkatx/kafkatx"
	"github.com/kafkatx/kafkatx/outbox/relay"
)

// Options configures Run.
type Options struct {
	Pool     *pgxpool.Pool
	Consumer *kafkatx.Consumer
	// Brokers and Schema configure the in-process relay.
	Brokers string
	Schema  string
	// ExitWhenIdle, when > 0, stops the consumer once, for this long, no message arrived,
	// nothing is in flight or in backoff and the outbox holds nothing to publish. The clock
	// starts at the first assignment; with none within NoAssignmentTimeout Run stops too.
	ExitWhenIdle time.Duration
	// NoAssignmentTimeout defaults to 2 minutes.
	NoAssignmentTimeout time.Duration
	Logger              *zap.Logger
	// Registry, when set, receives the relay's metrics; MetricsAddr serves it (and whatever
	// the consumer registered in it) on /metrics.
	Registry    *prometheus.Registry
	MetricsAddr string
}

// Run runs the relay and the consumer until ctx is cancelled, the consumer fails, or it is
// idle (Options.ExitWhenIdle). It returns the consumer's error; the relay is stopped after
// the consumer, so records its last transactions wrote are published first when it can.
func Run(ctx context.Context, o Options) error {
	if o.NoAssignmentTimeout <= 0 {
		o.NoAssignmentTimeout = 2 * time.Minute
	}
	rcfg := &relay.Config{Kafka: kafka.ConfigMap{"bootstrap.servers": o.Brokers}, Schema: o.Schema, Logger: o.Logger}
	if o.Registry != nil {
		rcfg.Registerer = o.Registry
	}
	rl, err := relay.New(o.Pool, rcfg)
	if err != nil {
		return err
	}
	if o.MetricsAddr != "" && o.Registry != nil {
		srv := &http.Server{Addr: o.MetricsAddr, Handler: promhttp.HandlerFor(o.Registry, promhttp.HandlerOpts{}), ReadHeaderTimeout: 5 * time.Second}
		ln, err := net.Listen("tcp", o.MetricsAddr)
		if err != nil {
			return fmt.Errorf("--metrics-addr: %w", err)
		}
		go func() { _ = srv.Serve(ln) }()
		defer srv.Close()
	}
	relayCtx, stopRelay := context.WithCancel(context.WithoutCancel(ctx))
	relayDone := make(chan error, 1)
	go func() { relayDone <- rl.Run(relayCtx) }()
	defer func() {
		stopRelay()
		if err := <-relayDone; err != nil {
			o.Logger.Warn("relay", zap.Error(err))
		}
	}()

	runCtx, cancel := context.WithCancel(ctx)
	defer cancel()
	done := make(chan error, 1)
	go func() { done <- o.Consumer.Run(runCtx) }()
	if o.ExitWhenIdle > 0 {
		go watchIdle(runCtx, cancel, o, rl)
	}
	return <-done
}

// watchIdle cancels the consumer once it is idle as Options.ExitWhenIdle says.
func watchIdle(ctx context.Context, cancel context.CancelFunc, o Options, rl *relay.Relay) {
	start := time.Now()
	t := time.NewTicker(100 * time.Millisecond)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
		s := o.Consumer.Stats()
		if s.FirstAssignedAt.IsZero() {
			if time.Since(start) > o.NoAssignmentTimeout {
				o.Logger.Warn("no partition assigned; exiting", zap.Duration("waited", time.Since(start)))
				cancel()
				return
			}
			continue
		}
		last := s.FirstAssignedAt
		if s.LastMessageAt.After(last) {
			last = s.LastMessageAt
		}
		if s.InFlight > 0 || s.Waiting > 0 || time.Since(last) < o.ExitWhenIdle {
			continue
		}
		// Only now, when otherwise idle: the outbox must be empty too.
		if backlog, _, err := rl.Backlog(ctx); err != nil || backlog > 0 {
			continue
		}
		o.Logger.Info("idle; exiting", zap.Duration("idle", time.Since(last)))
		cancel()
		return
	}
}
