package main

import (
	"context"
	"strconv"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"

	"github.com/kafkatx/kafkatx"
)

func stamped(ago time.Duration) *kafkatx.Message {
	ns := strconv.FormatInt(time.Now().Add(-ago).UnixNano(), 10)
	return &kafkatx.Message{Headers: []kafkatx.Header{{Key: headerProduced, Value: []byte(ns)}}}
}

func statement(p *commitProbe, conn *pgx.Conn, sql, tag string, err error) {
	ctx := p.TraceQueryStart(context.Background(), conn, pgx.TraceQueryStartData{SQL: sql})
	p.TraceQueryEnd(ctx, conn, pgx.TraceQueryEndData{CommandTag: pgconn.NewCommandTag(tag), Err: err})
}

// The probe counts a transaction's messages once, when its COMMIT succeeds, and never for a
// rollback, a failed commit or a transaction abandoned without either.
func TestCommitProbe(t *testing.T) {
	p := newCommitProbe()
	a, b := new(pgx.Conn), new(pgx.Conn)

	statement(p, a, "begin", "BEGIN", nil)
	p.holding(a, []*kafkatx.Message{stamped(40 * time.Millisecond), {}})
	statement(p, a, "INSERT ...", "INSERT 0 2", nil) // other statements change nothing
	statement(p, b, "begin", "BEGIN", nil)
	p.holding(b, []*kafkatx.Message{stamped(0)})
	statement(p, b, "rollback", "ROLLBACK", nil)
	statement(p, a, "commit", "COMMIT", nil)
	if got := p.committed.Load(); got != 2 {
		t.Fatalf("committed = %d after one commit of 2 and a rollback, want 2", got)
	}
	if p.firstN.Load() != 2 {
		t.Fatalf("firstN = %d, want 2", p.firstN.Load())
	}
	lat := p.latencies()
	if len(lat) != 1 || lat[0] < 40*time.Millisecond || lat[0] > 5*time.Second {
		t.Fatalf("latencies = %v, want one of at least 40ms", lat)
	}

	// A COMMIT that fails, or that PostgreSQL answers with ROLLBACK (an aborted transaction),
	// counts nothing; nor does a batch left behind by a new BEGIN.
	p.holding(b, []*kafkatx.Message{{}})
	statement(p, b, "commit", "", context.Canceled)
	p.holding(b, []*kafkatx.Message{{}})
	statement(p, b, "commit", "ROLLBACK", nil)
	p.holding(b, []*kafkatx.Message{{}})
	statement(p, b, "begin", "BEGIN", nil)
	statement(p, b, "commit", "COMMIT", nil)
	if got := p.committed.Load(); got != 2 {
		t.Fatalf("committed = %d, want still 2", got)
	}
}

func TestQuantile(t *testing.T) {
	var d []time.Duration
	for i := 1; i <= 100; i++ {
		d = append(d, time.Duration(i)*time.Millisecond)
	}
	for _, c := range []struct {
		q    float64
		want float64
	}{{0.5, 50}, {0.99, 99}, {1, 100}, {0.001, 1}} {
		if got := quantile(d, c.q); got != c.want {
			t.Errorf("quantile(1..100ms, %v) = %v, want %v", c.q, got, c.want)
		}
	}
	if quantile(nil, 0.5) != 0 {
		t.Error("quantile of nothing is not 0")
	}
}
