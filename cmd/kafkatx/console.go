package main

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/http"
	"net/url"
	"os"
	"strings"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"go.uber.org/zap"

	"github.com/kafkatx/kafkatx/cmd/kafkatx/console"
	"github.com/kafkatx/kafkatx/idempotency/airflow"
	"github.com/kafkatx/kafkatx/internal/pgerr"
)

// ConsoleCmd serves the operator console (package console) over HTTP.
type ConsoleCmd struct {
	Addr      string `default:"127.0.0.1:8089" help:"Listen address HOST:PORT (default loopback only: put a TLS proxy in front to serve others)."`
	TokenFile string `name:"token-file" required:"" type:"path" help:"File holding the token every page and API call needs (trimmed; at least 16 bytes; re-read when it changes)."`
	ReadOnly  bool   `name:"read-only" help:"Refuse every action (403): a console to look, not to touch."`
	BasePath  string `name:"base-path" help:"Path prefix when a reverse proxy serves the console under one, such as /kafkatx (links and the session cookie use it)."`
	// Airflow: with --airflow-url the offsets page shows the group's Airflow drift.
	AirflowAccess    `embed:""`
	AirflowQueuedFor time.Duration `name:"airflow-queued-for" default:"10m" help:"With --airflow-url: a run queued longer than this counts as queued drift (as kafkatx airflow status --queued-for)."`
}

// Validate checks what kong cannot.
func (c *ConsoleCmd) Validate() error {
	if c.AirflowQueuedFor <= 0 {
		return fmt.Errorf("--airflow-queued-for %v: want a positive duration", c.AirflowQueuedFor)
	}
	return c.AirflowAccess.validate()
}

// airflowDrift returns the console's Config.AirflowDrift: the group's ledger compared with
// Airflow as kafkatx airflow status does (the runs an operator's skip cleared counted apart),
// or nil without --airflow-url.
func (c *ConsoleCmd) airflowDrift(g *Globals, pool *pgxpool.Pool) (func(context.Context, string) (console.AirflowDrift, error), error) {
	if !c.AirflowAccess.given() {
		return nil, nil
	}
	client, err := c.AirflowAccess.client(g)
	if err != nil {
		return nil, err
	}
	return func(ctx context.Context, group string) (console.AirflowDrift, error) {
		entries, err := airflow.ReadLedger(ctx, pool, g.Schema, airflow.LedgerFilter{Group: group})
		if pgerr.IsCode(err, "42P01") || err == nil && len(entries) == 0 {
			return console.AirflowDrift{NoLedger: true}, nil
		}
		if err != nil {
			return console.AirflowDrift{}, err
		}
		rep, err := compareAirflow(ctx, client, entries, c.AirflowQueuedFor, time.Now())
		if err != nil {
			return console.AirflowDrift{}, err
		}
		if err := clearedBySkip(ctx, pool, g.Schema, group, rep); err != nil {
			return console.AirflowDrift{}, err
		}
		return console.AirflowDrift{Entries: rep.Entries, Missing: rep.count(driftMissing), Queued: rep.count(driftQueued),
			Failed: rep.count(driftFailed), Cleared: rep.Cleared}, nil
	}, nil
}

// secrets are the Airflow credentials the console must never render: the password
// and token files' contents (as read at start) and a password in --airflow-url.
func (a *AirflowAccess) secrets() []string {
	var out []string
	for _, path := range []string{a.TokenFile, a.PasswordFile} {
		if path == "" {
			continue
		}
		if b, err := os.ReadFile(path); err == nil {
			if s := strings.TrimSpace(string(b)); s != "" {
				out = append(out, s)
			}
		}
	}
	if u, err := url.Parse(a.AirflowURL); err == nil && u.User != nil {
		if pw, ok := u.User.Password(); ok && pw != "" {
			out = append(out, pw)
		}
	}
	return out
}

// Help is the long help of console.
func (ConsoleCmd) Help() string {
	return `Serves a web UI and a JSON API over the same data and actions as this command: partitions
(watermark against Kafka's committed offset, drift, the offset audit trail, lockstep resets),
dead letters (filters, failure fingerprints, replay or discard after a dry run) and the outbox
(backlog, parked rows, the relay's leader, replication slots). Every page and API call needs
the token (Authorization: Bearer <token>, or a session opened on /signin); every action is
audited with the operator's name and a reason. With --airflow-url (and its credentials, as
kafkatx airflow status) a group's offsets page also shows its Airflow drift. With --shard
NAME=URL for each shard (the flags the sharded service runs with), the partitions and offsets
pages and GET /api/partitions read every shard, with a shard column (a "shard" field) and
any stale copy named; offset resets are then refused there (use kafkatx offsets reset with
the same flags). The whole API is in docs/console.md.

Examples:
  kafkatx --database-url "$DIR_URL" --shard a="$A_URL" --shard b="$B_URL" \
    console --token-file /run/secrets/console-token`
}

func (c *ConsoleCmd) Run(ctx context.Context, g *Globals) error {
	log := g.logger()
	defer func() { _ = log.Sync() }()
	kcfg, err := g.kafkaConfig("kafkatx-console")
	if err != nil {
		return err
	}
	pool, err := g.outboxPool(ctx)
	if err != nil {
		return err
	}
	defer pool.Close()
	if err := offsetsCheckSchema(ctx, pool, g.Schema); err != nil {
		return err
	}
	var secrets []string
	if u, err := url.Parse(g.DatabaseURL); err == nil && u.User != nil {
		if pw, ok := u.User.Password(); ok {
			secrets = append(secrets, pw)
		}
	}
	secrets = append(secrets, c.AirflowAccess.secrets()...)
	drift, err := c.airflowDrift(g, pool)
	if err != nil {
		return err
	}
	set, closeShards, err := g.shardSet(ctx, pool)
	if err != nil {
		return err
	}
	defer closeShards()
	if set != nil {
		for _, sh := range set.Shards {
			if err := offsetsCheckSchema(ctx, sh.Pool, g.Schema); err != nil {
				return fmt.Errorf("shard %s: %w", sh.Name, err)
			}
		}
	}
	h, err := console.New(console.Config{Pool: pool, Schema: g.Schema, Kafka: kcfg, TokenFile: c.TokenFile, ReadOnly: c.ReadOnly,
		BasePath: c.BasePath, Logger: log, Secrets: secrets, AirflowDrift: drift, Shards: set})
	if err != nil {
		return &exitError{code: exitUsage, err: err}
	}
	defer h.Close()
	var handler http.Handler = h
	if bp := strings.TrimRight(c.BasePath, "/"); bp != "" {
		mux := http.NewServeMux()
		mux.Handle(bp+"/", http.StripPrefix(bp, h))
		handler = mux
	}
	ln, err := listen("addr", c.Addr)
	if err != nil {
		return err
	}
	srv := &http.Server{Handler: handler, ReadHeaderTimeout: 10 * time.Second, ReadTimeout: 30 * time.Second,
		WriteTimeout: console.RequestTimeout + 15*time.Second, IdleTimeout: 2 * time.Minute, MaxHeaderBytes: 64 << 10,
		ErrorLog: zap.NewStdLog(log)}
	log.Info("console: listening", zap.String("addr", ln.Addr().String()), zap.Bool("read_only", c.ReadOnly), zap.String("schema", g.Schema))
	if host, _, _ := net.SplitHostPort(ln.Addr().String()); host != "" && !net.ParseIP(host).IsLoopback() {
		log.Warn("console: listening beyond the loopback interface without TLS: put a TLS proxy in front", zap.String("addr", ln.Addr().String()))
	}
	errc := make(chan error, 1)
	go func() { errc <- srv.Serve(ln) }()
	select {
	case err := <-errc:
		return fmt.Errorf("console: %w", err)
	case <-ctx.Done():
	}
	sctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 10*time.Second)
	defer cancel()
	if err := srv.Shutdown(sctx); err != nil && !errors.Is(err, http.ErrServerClosed) {
		return fmt.Errorf("console: shutdown: %w", err)
	}
	return nil
}
