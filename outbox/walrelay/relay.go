// Package walrelay publishes the records of a schema's WAL-mode outbox (package outbox, Mode
// ModeWAL) from its logical replication slot to Kafka, exactly once for read_committed
// readers (docs/outbox-wal.md).
//
// It streams the slot with pgoutput (proto_version 1, messages on, streaming off), so each
// transaction's messages arrive at its commit, in commit order, never after a rollback. The
// records of one or more whole decoded transactions go into one Kafka transaction together
// with a checkpoint record (the last commit LSN included) on a compacted topic; only after
// that Kafka commit does the relay confirm the transactions' end to the slot. On start it
// reads the checkpoint (read_committed) and skips every transaction it covers, so what the
// slot resends after a crash is not published twice. A second relay is fenced by the slot
// (SQLSTATE 55006: it waits) and by the producer's transactional.id.
package walrelay

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"time"

	"github.com/jackc/pglogrepl"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"
	"go.uber.org/zap"

	"github.com/kafkatx/kafkatx/internal/kafkaname"
	"github.com/kafkatx/kafkatx/outbox"
	"github.com/kafkatx/kafkatx/outbox/internal/publish"
	"github.com/kafkatx/kafkatx/pg"
	"github.com/kafkatx/kafkatx/retention"
)

// Relay is a WAL relay. Create it with New and run it with Run.
type Relay struct {
	pool *pgxpool.Pool
	cfg  Config
	log  *zap.Logger
	m    *metrics

	streaming atomic.Bool
	// standby: the last try found the slot streamed by another relay (SQLSTATE 55006), a
	// healthy state as a table relay's standby is: Ready, Stats.
	standby atomic.Bool
	// reach is the streaming producer's (nil when not streaming): Ready.
	reach atomic.Pointer[publish.Reach]
	// failSince is when the relay last stopped streaming on an error with no stream since
	// (unix nanoseconds; 0: streaming, or not failed), failErr that error: Ready.
	failSince atomic.Int64
	failErr   atomic.Pointer[string]
	// parkFail is the last failure to store a record as a parked row (nil once a park or a
	// Kafka commit succeeded since): the stream stops at that record and starts again at it,
	// so streaming alone does not say the relay publishes. Ready.
	parkFail atomic.Pointer[parkFailure]
	// stopped is the FatalError that ended Run, for Health (nil while it has not).
	stopped   atomic.Pointer[string]
	caughtUp  atomic.Uint64 // everything committed before this LSN is published (or not ours)
	wantReply atomic.Bool   // Pending asks the server for its position
	diagnose  atomic.Bool   // the next stream asks for delivery reports
	batchSize atomic.Int64  // librdkafka batch.size, lowered to the smallest topic limit seen

	published, parked, transactions atomic.Int64
	steps                           stepTimes
	logged                          atomic.Bool   // "streaming" logged once
	timeline                        atomic.Uint32 // the timeline of the last stream ("streaming" logged again when it changes)

	mu      sync.Mutex
	refuse  map[position]string // records the broker refused: parked when decoded again
	isolate map[position]bool   // records of a refused batch: produced alone to find the culprit
	health  Health
}

// position is a record's identity: its transaction's commit LSN and its 0-based position
// among that transaction's outbox messages.
type position struct {
	commit pglogrepl.LSN
	pos    uint32
}

// stepTimes accumulates where the stream's time went, in nanoseconds.
type stepTimes struct {
	receive, handle, queueFull, commit atomic.Int64
}

// StepTimes is where a relay's stream spent its time since New (for benchmarks): waiting for
// the server (Receive), decoding and producing what arrived (Handle, which includes
// QueueFull: waiting for deliveries while librdkafka's queue was full), and committing Kafka
// transactions (Commit, which waits for the deliveries still in flight).
type StepTimes struct {
	Receive, Handle, QueueFull, Commit time.Duration
}

// Stats are a relay's counters since New.
type Stats struct {
	Steps        StepTimes
	Published    int64 // records the broker acknowledged in committed Kafka transactions
	Parked       int64 // records parked (refused by the broker or undecodable)
	Transactions int64 // Kafka transactions committed
	Streaming    bool
	// Standby: not streaming because another relay streams the slot (its last try got
	// SQLSTATE 55006); it takes over when that one stops. Ready while it waits.
	Standby bool
}

// New checks cfg and returns a relay.
func New(pool *pgxpool.Pool, cfg Config) (*Relay, error) {
	cfg = cfg.withDefaults()
	if pool == nil {
		return nil, errors.New("walrelay: nil pool")
	}
	if cfg.Replication == nil {
		return nil, errors.New("walrelay: Config.Replication is required (a session connection; the relay adds replication=database)")
	}
	if _, ok := cfg.Kafka["bootstrap.servers"]; !ok {
		return nil, errors.New("walrelay: Config.Kafka has no bootstrap.servers")
	}
	if err := publish.RefuseSettings(cfg.Kafka); err != nil {
		return nil, fmt.Errorf("walrelay: Config.Kafka %w", err)
	}
	if err := kafkaname.Topic(cfg.CheckpointTopic); err != nil {
		return nil, fmt.Errorf("walrelay: Config.CheckpointTopic: %w", err)
	}
	r := &Relay{pool: pool, cfg: cfg, log: cfg.Logger.With(zap.String("relay", "wal"), zap.String("schema", cfg.Schema)),
		refuse: map[position]string{}, isolate: map[position]bool{}}
	m, err := newMetrics(cfg.Registerer, r)
	if err != nil {
		return nil, err
	}
	r.m = m
	return r, nil
}

// Stats returns the relay's counters.
func (r *Relay) Stats() Stats {
	return Stats{Steps: StepTimes{Receive: time.Duration(r.steps.receive.Load()), Handle: time.Duration(r.steps.handle.Load()),
		QueueFull: time.Duration(r.steps.queueFull.Load()), Commit: time.Duration(r.steps.commit.Load())},
		Published: r.published.Load(), Parked: r.parked.Load(), Transactions: r.transactions.Load(), Streaming: r.streaming.Load(),
		Standby: r.standby.Load()}
}

// FatalError is Run's error when the relay cannot go on without an operator: the slot is
// lost, invalidated or missing, or the server lacks what WAL mode needs.
type FatalError struct{ Err error }

func (e *FatalError) Error() string { return e.Err.Error() }
func (e *FatalError) Unwrap() error { return e.Err }

// Run streams until ctx ends (then nil) or a FatalError. Other errors (the broker, the
// database, another relay holding the slot) are logged and retried after RetryInterval. A
// stream ended on purpose — a record refused (errRestart, or a failed commit that the next
// stream diagnoses with delivery reports) or batch.size lowered (errBatchSize) — streams again
// at once, up to maxQuickRestarts times in a row: waiting RetryInterval there only delayed the
// records after the refused one (2.9 s from the commit of a refused record and the next to
// the next's publication, 1.0 s without the waits: TestRecordRefusedMidStreamIsParkedAndTheNext
// Published).
func (r *Relay) Run(ctx context.Context) error {
	quick := 0
	for {
		err := r.runOnce(ctx)
		r.streaming.Store(false)
		if ctx.Err() != nil {
			return nil
		}
		var pe *pgconn.PgError
		inUse := errors.As(err, &pe) && pe.Code == "55006"
		wasStandby := r.standby.Swap(inUse)
		switch {
		case inUse:
			// Another relay streams the slot, so the schema's events are being published:
			// waiting for it is not a failure (a second replica of a service running its relay
			// in-process was reported not ready for as long as the first ran).
			r.failSince.Store(0)
		case err != nil:
			r.failSince.CompareAndSwap(0, time.Now().UnixNano())
			msg := err.Error()
			r.failErr.Store(&msg)
		}
		var fe *FatalError
		if errors.As(err, &fe) {
			msg := err.Error()
			r.stopped.Store(&msg) // Health().Ready() and kafkatx_walrelay_slot_ready read 0 from now on
			r.log.Error("WAL relay stopped", zap.Error(err))
			return err
		}
		if (errors.Is(err, errRestart) || errors.Is(err, errBatchSize) || r.diagnose.Load()) && quick < maxQuickRestarts {
			quick++
			r.log.Info("WAL relay: streaming again at once", zap.Error(err))
			continue
		}
		quick = 0
		switch {
		case inUse && !wasStandby: // once when it starts waiting, not at every retry
			r.log.Info("the slot is in use by another relay (or a walsender not yet gone); waiting", zap.String("detail", pe.Message))
		case inUse:
		case err != nil:
			r.log.Warn("WAL relay: reconnecting", zap.Error(err))
		}
		select {
		case <-ctx.Done():
			return nil
		case <-time.After(r.cfg.RetryInterval):
		}
	}
}

// maxQuickRestarts is how many streams in a row Run starts again without RetryInterval's
// wait after a planned end (a refused record takes up to three: diagnose, park, batch.size).
const maxQuickRestarts = 4

// NotReadyAfter is how long the relay may be kept from streaming by errors, with no stream
// between, before Ready reports it.
const NotReadyAfter = 10 * time.Second

// Ready returns nil unless the relay has not streamed for NotReadyAfter or longer because
// every try failed (waiting while another relay streams the slot is not a failure: a standby
// is ready, as a table relay's is), or streams while librdkafka has reported every broker down for
// NotReadyAfter with none answering since (also with nothing to publish: nothing written now
// would be), and then an error naming since when and the last failure. For a readiness
// probe of the process that runs it (kafkatx.Consumer.AddReadinessCheck); safe from any
// goroutine. A record the relay cannot store as a parked row (PostgreSQL refuses the row)
// stops every stream at it: after NotReadyAfter of that, Ready names the record and the
// refusal, however often the stream starts again.
func (r *Relay) Ready(context.Context) error {
	if f := r.parkFail.Load(); f != nil && time.Since(f.since) >= NotReadyAfter {
		return fmt.Errorf("the outbox's WAL relay cannot publish past the record at commit LSN %s, position %d (topic %s) since %s: it cannot be stored as a parked row: %s",
			f.at.commit, f.at.pos, f.topic, f.since.UTC().Format(time.RFC3339), f.err)
	}
	if k := r.reach.Load(); k != nil && r.streaming.Load() {
		if err := k.NotReady(NotReadyAfter); err != nil {
			return fmt.Errorf("the outbox's WAL relay cannot publish: %w", err)
		}
	}
	n := r.failSince.Load()
	if n == 0 || r.streaming.Load() || time.Since(time.Unix(0, n)) < NotReadyAfter {
		return nil
	}
	msg := ""
	if p := r.failErr.Load(); p != nil {
		msg = *p
	}
	return fmt.Errorf("the outbox's WAL relay cannot publish: it has not streamed since %s: %s", time.Unix(0, n).UTC().Format(time.RFC3339), msg)
}

// Pending reports whether something written before the call may not be published yet: it
// takes the server's current WAL position and waits up to 2 s for the relay to have streamed
// past it with nothing unpublished (asking the server for its position); a relay not
// streaming compares the slot's confirmed position instead. --exit-when-idle uses it.
func (r *Relay) Pending(ctx context.Context) (bool, error) {
	var now pglogrepl.LSN
	if err := r.pool.QueryRow(ctx, `SELECT pg_current_wal_lsn()`).Scan(&now); err != nil {
		return true, fmt.Errorf("walrelay: read the WAL position: %w", err)
	}
	deadline := time.Now().Add(2 * time.Second)
	for {
		if pglogrepl.LSN(r.caughtUp.Load()) >= now {
			return false, nil
		}
		if !r.streaming.Load() {
			s, err := outbox.ReadSettings(ctx, r.pool, r.cfg.Schema)
			if err != nil {
				return true, err
			}
			var confirmed *pglogrepl.LSN
			err = r.pool.QueryRow(ctx, `SELECT confirmed_flush_lsn FROM pg_replication_slots WHERE slot_name = $1`, s.Slot).Scan(&confirmed)
			if err != nil {
				return true, fmt.Errorf("walrelay: read slot %s: %w", s.Slot, err)
			}
			return confirmed == nil || *confirmed < now, nil
		}
		if time.Now().After(deadline) {
			return true, nil
		}
		r.wantReply.Store(true)
		t := time.NewTimer(20 * time.Millisecond)
		select {
		case <-ctx.Done():
			t.Stop()
			return true, ctx.Err()
		case <-t.C:
		}
	}
}

// runOnce checks the server, takes the slot, fences older producers, reads the checkpoint
// and streams until an error.
func (r *Relay) runOnce(ctx context.Context) error {
	// What Pending compares is re-learnt on each stream: after a failover the server's WAL
	// position is of another timeline, possibly below what the old primary's stream reached.
	r.caughtUp.Store(0)
	schema := pg.SchemaOr(r.cfg.Schema)
	s, err := outbox.ReadSettings(ctx, r.pool, schema)
	if err != nil {
		return err
	}
	if s.Slot == "" {
		return &FatalError{fmt.Errorf("walrelay: schema %s never was in WAL mode (no slot): run %s", schema, outbox.RecoverSlotSteps(schema, false))}
	}
	if s.Mode != outbox.ModeWAL {
		r.log.Warn("the outbox is in table mode; the WAL relay publishes what its slot still holds", zap.String("slot", s.Slot))
	}
	if err := r.preflight(ctx, s); err != nil {
		return err
	}
	pc := r.cfg.Replication.Config.Copy()
	if pc.RuntimeParams == nil {
		pc.RuntimeParams = map[string]string{}
	}
	pc.RuntimeParams["replication"] = "database"
	conn, err := pgconn.ConnectConfig(ctx, pc)
	if err != nil {
		return fmt.Errorf("walrelay: replication connection: %w", err)
	}
	defer conn.Close(context.WithoutCancel(ctx))
	sys, err := pglogrepl.IdentifySystem(ctx, conn)
	if err != nil {
		return fmt.Errorf("walrelay: IDENTIFY_SYSTEM: %w", err)
	}
	tl, err := readTimelines(ctx, conn, sys.Timeline)
	if err != nil {
		return err
	}
	key := sys.SystemID + "/" + sys.DBName + "/" + s.Slot
	h, err := r.readSlot(ctx, s.Slot)
	if err != nil {
		return err
	}
	if fe := h.fatal(s.Slot, schema); fe != nil {
		// The slot is gone (a failover to a node without a copy of it, a drop) or invalidated:
		// say from which checkpoint on this server's history the events are missing.
		ck, cerr := readCheckpoint(ctx, r.cfg, []byte(key))
		if cerr != nil {
			return fe
		}
		return slotLost(h, s.Slot, schema, ck, tl)
	}
	err = pglogrepl.StartReplication(ctx, conn, s.Slot, 0, pglogrepl.StartReplicationOptions{
		Mode:       pglogrepl.LogicalReplication,
		PluginArgs: []string{"proto_version '1'", "publication_names '" + s.Publication + "'", "messages 'true'"},
	})
	if err != nil {
		return fmt.Errorf("walrelay: START_REPLICATION of slot %s: %w", s.Slot, err)
	}
	k, err := newKafka(ctx, r.cfg, s.Slot, key, r.diagnose.Swap(false), int(r.batchSize.Load()), r.log)
	if err != nil {
		return err
	}
	defer k.close()
	r.reach.Store(k.reach)
	defer r.reach.Store(nil)
	ck, err := readCheckpoint(ctx, r.cfg, k.key)
	if err != nil {
		return err
	}
	cov, err := tl.covered(ck)
	if err != nil {
		return err
	}
	if cov.lostFrom > 0 {
		r.log.Warn("failover: the checkpoint covers transactions of an older timeline past its end; the database lost them after their events were published "+
			"(ghost events until their input is processed again); transactions of the new timeline are published",
			zap.Stringer("checkpoint_commit_lsn", ck.LSN), zap.Uint32("checkpoint_timeline", ck.Timeline),
			zap.Stringer("timeline_end", cov.lostFrom), zap.Uint32("timeline", tl.current))
	}
	st := &stream{r: r, conn: conn, k: k, prefix: outbox.WALPrefix(schema), ckpt: cov.through, slot: s.Slot,
		src: sourceHash(sys.SystemID, sys.DBName, schema), sysID: sys.SystemID, tl: tl}
	r.streaming.Store(true)
	r.standby.Store(false)
	r.failSince.Store(0)
	if !r.logged.Swap(true) || tl.current != r.timeline.Swap(tl.current) {
		r.log.Info("streaming", zap.String("slot", s.Slot), zap.String("publication", s.Publication),
			zap.Stringer("checkpoint_commit_lsn", ck.LSN), zap.Uint32("checkpoint_timeline", ck.Timeline),
			zap.Stringer("skip_through", cov.through), zap.Uint32("timeline", tl.current), zap.Stringer("server_wal", sys.XLogPos))
	}
	watchCtx, stopWatch := context.WithCancel(ctx)
	defer stopWatch()
	// Retention runs while this relay holds the slot: one process per database deletes.
	retained := make(chan struct{})
	defer func() { stopWatch(); <-retained }()
	go func() {
		defer close(retained)
		retention.New(r.pool, schema, r.cfg.Retention, r.log).Run(watchCtx)
	}()
	watchErr := make(chan error, 1)
	go func() { watchErr <- r.watchSlot(watchCtx, s.Slot) }()
	streamCtx, stopStream := context.WithCancel(ctx)
	defer stopStream()
	go func() {
		select {
		case <-watchCtx.Done():
		case err := <-watchErr:
			watchErr <- err
			stopStream()
		}
	}()
	err = st.run(streamCtx)
	select {
	case werr := <-watchErr:
		if werr != nil {
			return werr
		}
	default:
	}
	return slotUnreadable(err, s.Slot, schema, ck, tl)
}

// preflight says exactly what is missing: the server's version, wal_level, the role's
// REPLICATION attribute, the publication. (The slot is checked next, with the checkpoint.)
func (r *Relay) preflight(ctx context.Context, s outbox.Settings) error {
	if err := outbox.CheckWALServer(ctx, r.pool); err != nil {
		return &FatalError{err}
	}
	var pub bool
	if err := r.pool.QueryRow(ctx, `SELECT EXISTS (SELECT 1 FROM pg_publication WHERE pubname = $1)`, s.Publication).Scan(&pub); err != nil {
		return fmt.Errorf("walrelay: look for publication %s: %w", s.Publication, err)
	}
	if !pub {
		return &FatalError{fmt.Errorf("walrelay: publication %s does not exist in this database: run %s (it creates it, empty)", s.Publication, outbox.RecoverSlotSteps(r.cfg.Schema, false))}
	}
	return nil
}

// Totals are Stats' published, parked and transactions counts by name (relays.Relay).
func (r *Relay) Totals() map[string]int64 {
	s := r.Stats()
	return map[string]int64{"published": s.Published, "parked": s.Parked, "transactions": s.Transactions}
}

// parkFailure is a record the relay could not store as a parked row: Ready.
type parkFailure struct {
	at         position
	topic, err string
	since      time.Time // the first failure at this record
}

// parkFailed records that parking the record at at failed with err, keeping the time of the
// first failure at the same record.
func (r *Relay) parkFailed(at position, topic string, err error) {
	f := &parkFailure{at: at, topic: pg.SanitizeText(topic, 300), err: pg.SanitizeText(err.Error(), 512), since: time.Now()}
	if old := r.parkFail.Load(); old != nil && old.at == at {
		f.since = old.since
	}
	r.parkFail.Store(f)
}
