// Package service runs a kafkatx consumer the way the example binaries do: with the outbox
// relay in-process (it publishes what the handlers and the dead letters write to the outbox),
// /metrics, /healthz and /readyz on --metrics-addr, an exit when Kafka authentication keeps
// failing, and an optional exit once idle, as docs/examples.md defines it.
package service

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"sync/atomic"
	"time"

	"github.com/confluentinc/confluent-kafka-go/v2/kafka"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promhttp"
	"go.uber.org/zap"

	"github.com/kafkatx/kafkatx"
	"github.com/kafkatx/kafkatx/cmd/kafkalog"
	"github.com/kafkatx/kafkatx/outbox"
	"github.com/kafkatx/kafkatx/outbox/relays"
	"github.com/kafkatx/kafkatx/shards"
)

// Options configures Run.
type Options struct {
	Pool     *pgxpool.Pool
	Consumer *kafkatx.Consumer
	// Brokers and Schema configure the in-process relay; KafkaConfig, when set, is its
	// producer's base configuration instead of bootstrap.servers=Brokers (Flags.ClientConfig:
	// --kafka-config-file's security settings).
	Brokers     string
	Schema      string
	KafkaConfig kafka.ConfigMap
	// Session, when set, is the relay's leadership connection (relay.Config.Session), for a
	// Pool that goes through a transaction pooler.
	Session *pgx.ConnConfig
	// OutboxMode selects the in-process relay (relays.New): outbox.ModeWAL runs a WAL relay
	// (package outbox/walrelay) streaming from the schema's slot over Session (or Pool's
	// configuration); "" or outbox.ModeTable the table relay.
	OutboxMode outbox.Mode
	// ExitWhenIdle, when > 0, stops the consumer once, for this long, no message arrived,
	// nothing is in flight or in backoff and the outbox holds nothing to publish, and the
	// group has caught up: Kafka answers and no partition of Topic has its log end ahead of
	// Group's watermark (idle.go). The clock starts at the first assignment; with none
	// within NoAssignmentTimeout Run stops too, with a *NoAssignmentError when Kafka cannot
	// be reached.
	ExitWhenIdle time.Duration
	// Group and Topic are the consumer's group id and topic, for ExitWhenIdle's check.
	Group, Topic string
	// NoAssignmentTimeout defaults to 2 minutes.
	NoAssignmentTimeout time.Duration
	Logger              *zap.Logger
	// Registry, when set, receives the relay's metrics; MetricsAddr serves it (and whatever
	// the consumer registered in it) on /metrics, with /healthz (200 while the process runs)
	// and /readyz (the consumer's Readiness as JSON: 200 when ready, else 503).
	Registry    *prometheus.Registry
	MetricsAddr string
	// Probes, when set, is the --metrics-addr server the binary started before it waited for
	// its database and topics (StartProbes); Run hands it the consumer's handler instead of
	// listening on MetricsAddr itself.
	Probes *Probes
	// Shards, when set, is the consumer's Config.Shards: Run runs one relay per shard (with
	// its retention) instead of one on Pool, each in its shard's stored outbox mode
	// (outbox.ReadSettings; OutboxMode is not used) on its shard's pool — in WAL mode the
	// shard's own slot, checkpoint and transactional.id — and ExitWhenIdle reads each
	// partition's watermark on the shards.
	Shards *shards.Set
	// AuthFailureExit ends Run with an error once Kafka authentication or authorization has
	// failed for this long without a success in between (Readiness.AuthErrorSince). Defaults
	// to 30s; negative: never.
	AuthFailureExit time.Duration
}

// DefaultAuthFailureExit is Options.AuthFailureExit's default.
const DefaultAuthFailureExit = 30 * time.Second

// Run runs the relay and the consumer until ctx is cancelled, the consumer fails, or it is
// idle (Options.ExitWhenIdle). It returns the consumer's error; the relay is stopped after
// the consumer, so records its last transactions wrote are published first when it can.
func Run(ctx context.Context, o Options) error {
	if o.NoAssignmentTimeout <= 0 {
		o.NoAssignmentTimeout = 2 * time.Minute
	}
	if o.AuthFailureExit == 0 {
		o.AuthFailureExit = DefaultAuthFailureExit
	}
	kcfg := kafka.ConfigMap{"bootstrap.servers": o.Brokers}
	if o.KafkaConfig != nil {
		kcfg = kafka.ConfigMap{}
		for k, v := range o.KafkaConfig {
			kcfg[k] = v
		}
	}
	ro := relays.Options{Mode: o.OutboxMode, Kafka: kafkalog.Route(o.Logger, kcfg), Schema: o.Schema, Logger: o.Logger, Session: o.Session}
	if ro.Mode == "" {
		ro.Mode = outbox.ModeTable
	}
	if o.Registry != nil {
		ro.Registerer = o.Registry
	}
	var rl inProcessRelay
	var err error
	if o.Shards != nil {
		var reg prometheus.Registerer
		if o.Registry != nil {
			reg = o.Registry
		}
		if rl, err = newShardRelays(ctx, o.Shards, ro, reg); err != nil {
			return err
		}
	} else if rl, err = relays.New(o.Pool, ro); err != nil {
		return err
	}
	o.Consumer.AddReadinessCheck("outbox relay", rl.Ready)
	if check := slotReady(rl); check != nil {
		o.Consumer.AddReadinessCheck("outbox slot", check)
	}
	if o.Probes == nil {
		if o.Probes, err = StartProbes(o.MetricsAddr, o.Registry); err != nil {
			return err
		}
		defer o.Probes.Close()
	}
	o.Probes.Serve(Handler(o.Consumer, o.Registry))
	runCtx, cancel := context.WithCancel(ctx)
	defer cancel()
	relayCtx, stopRelay := context.WithCancel(context.WithoutCancel(ctx))
	// A stop (SIGTERM: ctx) stops the relay at once, beside the consumer, rather than after
	// the consumer's Run returned: both wait for Kafka (delivery reports, the last offset
	// commit), and one after the other they added up when it did not answer. Rows committed
	// after the relay stopped are published by the next run. An exit when idle or a relay
	// error stops it after the consumer (the defer below).
	go func() {
		select {
		case <-ctx.Done():
			stopRelay()
		case <-relayCtx.Done():
		}
	}()
	relayDone := make(chan error, 1)
	var relayErr atomic.Pointer[error]
	go func() {
		err := rl.Run(relayCtx)
		if err != nil && relayCtx.Err() == nil {
			// The relay gave up (a WAL relay's lost slot, for one): stop the consumer too,
			// rather than writing events no relay publishes.
			relayErr.Store(&err)
			cancel()
		}
		relayDone <- err
	}()
	defer func() {
		stopRelay()
		if err := <-relayDone; err != nil && relayErr.Load() == nil {
			o.Logger.Warn("relay", zap.Error(err))
		}
	}()

	done := make(chan error, 1)
	go func() { done <- o.Consumer.Run(runCtx) }()
	idleErr := make(chan error, 1)
	if o.ExitWhenIdle > 0 {
		check, err := newIdleCheck(o, kcfg)
		if err != nil {
			cancel()
			<-done
			return err
		}
		defer check.close()
		go func() { idleErr <- watchIdle(runCtx, cancel, o, rl, check) }()
	}
	authErr := make(chan error, 1)
	if o.AuthFailureExit > 0 {
		go func() { authErr <- watchAuth(runCtx, cancel, o) }()
	}
	err = <-done
	cancel()
	if o.ExitWhenIdle > 0 {
		if ierr := <-idleErr; ierr != nil && err == nil {
			err = ierr
		}
	}
	if re := relayErr.Load(); re != nil && err == nil {
		err = fmt.Errorf("outbox relay: %w", *re)
	}
	if o.AuthFailureExit > 0 {
		if aerr := <-authErr; aerr != nil && err == nil {
			err = aerr
		}
	}
	return err
}

// inProcessRelay is the table relay or the WAL relay.
type inProcessRelay = relays.Relay

// Handler serves /metrics (reg, when set), /healthz (200: the process runs) and /readyz
// (c's Readiness as JSON: 200 when ready, 503 otherwise).
func Handler(c *kafkatx.Consumer, reg *prometheus.Registry) http.Handler {
	mux := http.NewServeMux()
	if reg != nil {
		mux.Handle("/metrics", promhttp.HandlerFor(reg, promhttp.HandlerOpts{}))
	}
	mux.HandleFunc("/healthz", func(w http.ResponseWriter, _ *http.Request) {
		fmt.Fprintln(w, "ok")
	})
	mux.HandleFunc("/readyz", func(w http.ResponseWriter, r *http.Request) {
		rd := c.Readiness(r.Context())
		body, _ := json.Marshal(rd)
		w.Header().Set("Content-Type", "application/json")
		if !rd.Ready {
			w.WriteHeader(http.StatusServiceUnavailable)
		}
		_, _ = w.Write(append(body, '\n'))
	})
	return mux
}

// watchAuth stops the consumer and returns an error once Kafka authentication or
// authorization has failed for o.AuthFailureExit (the library keeps retrying; the binary
// decides to exit). It returns nil when ctx ends first.
func watchAuth(ctx context.Context, cancel context.CancelFunc, o Options) error {
	t := time.NewTicker(time.Second)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return nil
		case <-t.C:
		}
		rd := o.Consumer.Readiness(ctx)
		if rd.AuthError != "" && time.Since(rd.AuthErrorSince) >= o.AuthFailureExit {
			cancel()
			return &AuthError{Since: rd.AuthErrorSince, For: time.Since(rd.AuthErrorSince), Err: errors.New(rd.AuthError)}
		}
	}
}

// AuthError is Run's error when Kafka authentication or authorization kept failing for
// Options.AuthFailureExit.
type AuthError struct {
	Since time.Time     // the first failure
	For   time.Duration // how long it had lasted when Run gave up
	Err   error         // the last failure
}

func (e *AuthError) Error() string {
	return fmt.Sprintf("Kafka authentication or authorization failing for %s (since %s): %v",
		e.For.Round(time.Second), e.Since.UTC().Format(time.RFC3339), e.Err)
}

func (e *AuthError) Unwrap() error { return e.Err }
