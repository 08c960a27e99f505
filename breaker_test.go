package kafkatx

import (
	"context"
	"encoding/json"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
)

// TestBreakerPausesASharedFailureAndResumes: a deploy renames the column every handler writes
// (SQLSTATE 42703, which no list can call the server's). After a few messages fail alike the
// breaker opens: no more attempts, no dead letters, readiness not ready naming the SQLSTATE,
// kafkatx_breaker_open 1. When the column is back every message is applied once and the
// breaker closes by itself.
func TestBreakerPausesASharedFailureAndResumes(t *testing.T) {
	t.Parallel()
	b := setup(t, 3)
	var recs []testRecord
	for p := int32(0); p < 3; p++ {
		recs = append(recs, values(10, p, func(i int) string { return fmt.Sprintf(`{"p%d":%d}`, p, i) })...)
	}
	produce(t, b.brokers, b.topic, recs)
	b.exec(t, `ALTER TABLE {{schema}}.effects RENAME COLUMN value TO payload`)
	cfg := b.config(t)
	reg := prometheus.NewRegistry()
	cfg.Registerer = reg
	cfg.Retry.MaxAttempts = 3
	cfg.Retry.InitialBackoff, cfg.Retry.MaxBackoff = 300*time.Millisecond, 300*time.Millisecond
	cfg.Breaker.Probe = 200 * time.Millisecond
	r := b.start(t, func(ctx context.Context, tx pgx.Tx, m *Message) error { return applyEffect(ctx, tx, b.schema, m) }, cfg)
	waitFor(t, 60*time.Second, "the breaker open", func() bool { return r.c.Readiness(context.Background()).Breaker != nil })
	time.Sleep(2 * time.Second) // probes fail meanwhile
	rd := r.c.Readiness(context.Background())
	body, _ := json.Marshal(rd)
	if rd.Ready || rd.Breaker == nil || rd.Breaker.SQLState != "42703" || !strings.Contains(strings.Join(rd.Reasons, " "), "SQLSTATE 42703") {
		t.Fatalf("readiness with the breaker open: %s", body)
	}
	if v := testutil.ToFloat64(mustGauge(t, reg, "kafkatx_breaker_open")); v != 1 {
		t.Fatalf("kafkatx_breaker_open = %v, want 1", v)
	}
	// Before it opened, at most the threshold's messages had failed attempts (one of them
	// may have been dead-lettered); while open, nothing more is spent.
	dl := b.q(t, "SELECT count(*) FROM {{schema}}.dead_letters")
	att := b.q(t, "SELECT count(*) FROM {{schema}}.attempts WHERE error_class <> ''")
	if dl+att > 3 {
		t.Fatalf("%d dead letters and %d messages with failed attempts; want at most the breaker's threshold (3) in all", dl, att)
	}
	time.Sleep(2 * time.Second)
	if dl2, att2 := b.q(t, "SELECT count(*) FROM {{schema}}.dead_letters"), b.q(t, "SELECT count(*) FROM {{schema}}.attempts WHERE error_class <> ''"); dl2 != dl || att2 > att {
		t.Fatalf("while open: dead letters %d → %d, failing messages %d → %d; want no change", dl, dl2, att, att2)
	}
	b.exec(t, `ALTER TABLE {{schema}}.effects RENAME COLUMN payload TO value`)
	waitFor(t, 60*time.Second, "every message applied", func() bool { return b.q(t, "SELECT count(*) FROM {{schema}}.effects") == 30-dl })
	waitFor(t, 30*time.Second, "the breaker closed", func() bool { return r.c.Readiness(context.Background()).Ready })
	if n := b.q(t, "SELECT count(*) FROM {{schema}}.effects WHERE applied <> 1"); n != 0 || b.q(t, "SELECT count(*) FROM {{schema}}.dead_letters") != dl {
		t.Fatalf("%d effects applied twice, or dead letters after the breaker opened", n)
	}
	if v := testutil.ToFloat64(mustGauge(t, reg, "kafkatx_breaker_open")); v != 0 {
		t.Fatalf("kafkatx_breaker_open = %v after it closed", v)
	}
}

// TestBreakerLeavesPoisonPillsToTheDeadLetterQueue: a poison pill in each partition, met at
// about the same time, among good messages: each is dead-lettered as without a breaker, and
// the breaker never opens.
func TestBreakerLeavesPoisonPillsToTheDeadLetterQueue(t *testing.T) {
	t.Parallel()
	b := setup(t, 3)
	var recs []testRecord
	for p := int32(0); p < 3; p++ {
		recs = append(recs, values(20, p, func(i int) string {
			if i == 0 || i == 10 {
				return "poison"
			}
			return fmt.Sprintf(`{"p%d":%d}`, p, i)
		})...)
	}
	produce(t, b.brokers, b.topic, recs)
	cfg := b.config(t)
	cfg.Retry.MaxAttempts = 2
	r := b.start(t, func(ctx context.Context, tx pgx.Tx, m *Message) error {
		if string(m.Value) == "poison" {
			return fmt.Errorf("decode order at offset %d: poison pill", m.Offset)
		}
		return applyEffect(ctx, tx, b.schema, m)
	}, cfg)
	opened := false
	waitFor(t, 60*time.Second, "the pills dead-lettered and the rest applied", func() bool {
		opened = opened || r.c.Readiness(context.Background()).Breaker != nil
		return b.q(t, "SELECT count(*) FROM {{schema}}.dead_letters") == 6 && b.q(t, "SELECT count(*) FROM {{schema}}.effects") == 54
	})
	if opened {
		t.Fatal("the breaker opened on poison pills")
	}
}

func mustGauge(t *testing.T, reg *prometheus.Registry, name string) prometheus.Collector {
	t.Helper()
	return gatherGauge{reg: reg, name: name}
}

// gatherGauge is a collector that yields the named metric of reg, for testutil.ToFloat64.
type gatherGauge struct {
	reg  *prometheus.Registry
	name string
}

func (g gatherGauge) Describe(ch chan<- *prometheus.Desc) { prometheus.DescribeByCollect(g, ch) }
func (g gatherGauge) Collect(ch chan<- prometheus.Metric) {
	mfs, _ := g.reg.Gather()
	for _, mf := range mfs {
		if mf.GetName() == g.name {
			for _, m := range mf.GetMetric() {
				ch <- prometheus.MustNewConstMetric(prometheus.NewDesc(g.name, "", nil, nil), prometheus.GaugeValue, m.GetGauge().GetValue())
			}
		}
	}
}
