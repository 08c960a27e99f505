package main

import (
	"context"
	"fmt"
	"strings"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/kafkatx/kafkatx/internal/offsets"
	"github.com/kafkatx/kafkatx/internal/tables"
)

// OffsetsCmd groups the offset commands: the database leads, Kafka follows (docs/offsets.md).
type OffsetsCmd struct {
	Status  OffsetsStatusCmd  `cmd:"" help:"Per partition: watermark, committed offset, log start/end, lag, drift, last audit event. Exit 0 aligned, 3 drift."`
	Reset   OffsetsResetCmd   `cmd:"" help:"Move the watermark and Kafka's committed offset in lockstep (skip, replay, align); dry run unless --execute."`
	Audit   OffsetsAuditCmd   `cmd:"" help:"The offset audit trail: skips, replays, alignments, drift found on assignment."`
	Account OffsetsAccountCmd `cmd:"" help:"Prove every offset up to the watermark is processed, dead-lettered or skipped. Exit 4 on a gap."`
}

// offsetsOperator connects to the database (and checks kafkatx's tables) and then, when
// withKafka, to the brokers, failing within --kafka-timeout when none answers. The returned
// func closes both.
func (g *Globals) offsetsOperator(ctx context.Context, withKafka bool) (*offsets.Operator, func(), error) {
	pool, err := g.pool(ctx)
	if err != nil {
		return nil, nil, err
	}
	if err := offsetsCheckSchema(ctx, pool, g.Schema); err != nil {
		pool.Close()
		return nil, nil, err
	}
	var k *offsets.Kafka
	if withKafka {
		cfg, err := g.kafkaConfig("kafkatx-offsets")
		if err != nil {
			pool.Close()
			return nil, nil, err
		}
		if k, err = offsets.NewKafka(cfg, g.logger()); err != nil {
			pool.Close()
			return nil, nil, err
		}
		if err := k.Reachable(g.Brokers, g.KafkaTimeout); err != nil {
			k.Close()
			pool.Close()
			return nil, nil, err
		}
	}
	return offsets.NewOperator(pool, k, g.Schema), func() {
		pool.Close()
		if k != nil {
			k.Close()
		}
	}, nil
}

// offsetsCheckSchema fails with a helpful message when kafkatx's tables are missing.
func offsetsCheckSchema(ctx context.Context, pool *pgxpool.Pool, schema string) error {
	var ok bool
	if err := pool.QueryRow(ctx, `SELECT to_regclass($1) IS NOT NULL`, tables.For(schema).OffsetAudit).Scan(&ok); err != nil {
		return fmt.Errorf("database: %w", err)
	}
	if !ok {
		return fmt.Errorf("schema %q has no kafkatx tables: run `kafkatx migrate up --schema %s` (or start a consumer) first", schema, shellQuote(schema))
	}
	return nil
}

// offsetsOutput validates an --output value.
func offsetsOutput(v string, allowed ...string) error {
	for _, a := range allowed {
		if v == a {
			return nil
		}
	}
	return fmt.Errorf("--output %q: want one of %s", v, strings.Join(allowed, ", "))
}
