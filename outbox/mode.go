package outbox

import (
	"context"
	"crypto/md5"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"slices"
	"strings"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/kafkatx/kafkatx/internal/msgfmt"
	"github.com/kafkatx/kafkatx/internal/tables"
	"github.com/kafkatx/kafkatx/pg"
)

// Mode is how the outbox of a schema carries records (docs/outbox-wal.md).
type Mode string

const (
	// ModeTable writes rows into <schema>.outbox, published by package outbox/relay. The
	// default.
	ModeTable Mode = "table"
	// ModeWAL writes each record as a transactional logical-decoding message
	// (pg_logical_emit_message(true, ...)), relayed from the schema's replication slot by
	// package outbox/walrelay. No outbox row is written.
	ModeWAL Mode = "wal"
)

// Modes are the outbox modes, in the order flags list them: the one list of the binaries'
// --outbox-mode values (ModeNames) and of ParseMode.
var Modes = []Mode{ModeWAL, ModeTable}

// ModeNames is Modes joined by sep ("wal,table" with ",").
func ModeNames(sep string) string {
	names := make([]string, len(Modes))
	for i, m := range Modes {
		names[i] = string(m)
	}
	return strings.Join(names, sep)
}

// ParseMode parses one of Modes; "" is "" (no choice: the stored mode).
func ParseMode(s string) (Mode, error) {
	if s == "" || slices.Contains(Modes, Mode(s)) {
		return Mode(s), nil
	}
	return "", fmt.Errorf("outbox mode %q: want %s", s, ModeNames(" or "))
}

// Settings is the schema's outbox_settings row (migration 008).
type Settings struct {
	Mode Mode
	// Chosen is false until a binary or an operator set the mode explicitly (SetMode).
	Chosen bool
	// Slot and Publication name the replication slot and the publication of WAL mode; empty
	// before WAL mode was first chosen.
	Slot, Publication string
}

// ErrModeConflict is returned by EnsureMode when the schema's stored mode is not the one asked.
var ErrModeConflict = errors.New("outbox mode conflict")

// ReadSettings reads schema's outbox settings. A schema without migration 008 is in table
// mode, not chosen.
func ReadSettings(ctx context.Context, q pg.Querier, schema string) (Settings, error) {
	schema = pg.SchemaOr(schema)
	var exists bool
	if err := q.QueryRow(ctx, `SELECT to_regclass($1) IS NOT NULL`, tables.For(schema).OutboxSettings).Scan(&exists); err != nil {
		return Settings{}, fmt.Errorf("outbox: read the outbox mode: %w", err)
	}
	if !exists {
		return Settings{Mode: ModeTable}, nil
	}
	var s Settings
	var slot, pub *string
	err := q.QueryRow(ctx, `SELECT mode, chosen, slot_name, publication_name FROM `+tables.For(schema).OutboxSettings).
		Scan(&s.Mode, &s.Chosen, &slot, &pub)
	if errors.Is(err, pgx.ErrNoRows) {
		return Settings{Mode: ModeTable}, nil
	}
	if err != nil {
		return Settings{}, fmt.Errorf("outbox: read the outbox mode: %w", err)
	}
	if slot != nil {
		s.Slot = *slot
	}
	if pub != nil {
		s.Publication = *pub
	}
	return s, nil
}

// SlotName is the replication slot a new WAL outbox of schema in database gets:
// "kafkatx_<database>_<schema>" lower-cased, every byte outside [a-z0-9_] replaced by "_",
// cut to 50 bytes, then "_" and 12 hex digits of sha256(database NUL schema). The readable
// part alone is not one-to-one — "tenant-a" and "tenant_a", "Orders" and "orders", database
// "a_b" with schema "c" and database "a" with schema "b_c" read alike — and two schemas
// sharing one slot lose events: each schema's relay confirms the slot past the other
// schema's messages, which it skips. The hash of the exact names keeps them apart (and with
// them the WAL relay's transactional.id and checkpoint key, derived from the slot name).
// SetMode records the name in the schema's outbox settings and every relay reads it from
// there, so a schema set up before this rule keeps its slot.
func SlotName(database, schema string) string {
	return identName("kafkatx_"+database+"_"+schema, database+"\x00"+schema)
}

// PublicationName is the (empty) publication a new WAL outbox of schema names in pgoutput's
// publication_names: "kafkatx_outbox_<schema>", shaped as SlotName (the hash of schema).
func PublicationName(schema string) string {
	return identName("kafkatx_outbox_"+schema, schema)
}

// identName is s made an identifier of at most 63 bytes ([a-z0-9_]) that stays one to one:
// its readable part, cut to 50 bytes, and "_" with 12 hex digits of sha256(hashOf).
func identName(s, hashOf string) string {
	b := identBytes(s)
	sum := sha256.Sum256([]byte(hashOf))
	return string(b[:min(len(b), 50)]) + "_" + hex.EncodeToString(sum[:])[:12]
}

// SetMode sets schema's outbox mode and marks it chosen (kafkatx migrate up --outbox-mode).
// For ModeWAL it first checks the server (PostgreSQL 14 or later, wal_level=logical), creates
// the publication and the replication slot (pgoutput) when missing — before any writer can
// emit — and only then switches; creating a slot waits for every transaction open in the
// cluster. It refuses to switch while the outbox table holds pending rows (publish them first
// with the table relay, e.g. `kafkatx relay --outbox-mode table --exit-when-idle 5s`). For
// ModeTable it refuses (wrapping ErrSlotHoldsRecords) while the slot, streamed by no relay,
// still holds outbox records no relay published (SlotPending; SetModeForce switches anyway);
// the slot stays, so a WAL relay still running can publish what it holds; drop it with
// DropSlot once that is done. pool must reach the database directly or through a session
// pooler (slot creation is not a transaction), with a role that has REPLICATION and may
// create publications.
func SetMode(ctx context.Context, pool *pgxpool.Pool, schema string, mode Mode) error {
	return setMode(ctx, pool, schema, mode, false)
}

// SetModeForce is SetMode without the refusal to switch to table mode while the schema's
// slot holds unpublished outbox records (kafkatx migrate up --outbox-mode table --force):
// those records are lost unless a WAL relay already streaming the slot publishes them.
func SetModeForce(ctx context.Context, pool *pgxpool.Pool, schema string, mode Mode) error {
	return setMode(ctx, pool, schema, mode, true)
}

// slotDrained is nil unless schema is in WAL mode and its slot, which no relay streams now,
// holds outbox records no relay published (SlotPending): switching to table mode then loses
// them, since a WAL relay refuses to start in table mode. A slot a relay streams is being
// drained (docs/outbox-wal.md, Switching with a backlog): the switch goes on.
func slotDrained(ctx context.Context, pool *pgxpool.Pool, schema string) error {
	st, err := ReadSettings(ctx, pool, schema)
	if err != nil || st.Mode != ModeWAL || st.Slot == "" {
		return err
	}
	n, active, err := SlotPending(ctx, pool, schema, st.Slot, st.Publication)
	if err != nil || active || n == 0 {
		return err
	}
	return fmt.Errorf("outbox: set mode table: %w: slot %s holds %d record(s) no relay published, which a switch loses "+
		"(a WAL relay refuses to start in table mode). Drain it first: kafkatx relay --exit-when-idle 5s --schema %s "+
		"(until it exits, the slot caught up), then switch; or pass --force to lose them",
		ErrSlotHoldsRecords, st.Slot, n, msgfmt.Quote(schema))
}

func setMode(ctx context.Context, pool *pgxpool.Pool, schema string, mode Mode, force bool) error {
	schema = pg.SchemaOr(schema)
	if mode != ModeTable && mode != ModeWAL {
		return fmt.Errorf("outbox: set mode %q: want wal or table", mode)
	}
	var slot, pub *string
	if mode == ModeWAL {
		if err := CheckWALServer(ctx, pool); err != nil {
			return err
		}
		var db string
		if err := pool.QueryRow(ctx, `SELECT current_database()`).Scan(&db); err != nil {
			return fmt.Errorf("outbox: set mode: %w", err)
		}
		// The names recorded with the schema stay (a slot may still hold its events); a
		// schema that never had a slot gets new ones.
		st, err := ReadSettings(ctx, pool, schema)
		if err != nil {
			return err
		}
		s, p := st.Slot, st.Publication
		if s == "" {
			if s, p, err = newNames(ctx, pool, db, schema); err != nil {
				return err
			}
		}
		if p == "" {
			p = PublicationName(schema)
		}
		slot, pub = &s, &p
		if err := slotIsOurs(ctx, pool, db, schema, s); err != nil {
			return err
		}
		var hasPub bool
		if err := pool.QueryRow(ctx, `SELECT EXISTS (SELECT 1 FROM pg_publication WHERE pubname = $1)`, p).Scan(&hasPub); err != nil {
			return fmt.Errorf("outbox: look for publication %s: %w", p, err)
		}
		if !hasPub {
			if _, err := pool.Exec(ctx, `CREATE PUBLICATION `+pgx.Identifier{p}.Sanitize()); err != nil && !isDuplicate(err) {
				return fmt.Errorf("outbox: create publication %s (needs CREATE on the database): %w", p, err)
			}
		}
		var hasSlot bool
		if err := pool.QueryRow(ctx, `SELECT EXISTS (SELECT 1 FROM pg_replication_slots WHERE slot_name = $1)`, s).Scan(&hasSlot); err != nil {
			return fmt.Errorf("outbox: look for slot %s: %w", s, err)
		}
		if !hasSlot {
			if _, err := pool.Exec(ctx, `SELECT pg_create_logical_replication_slot($1, 'pgoutput')`, s); err != nil && !isDuplicate(err) {
				return fmt.Errorf("outbox: create replication slot %s (needs the REPLICATION attribute and a free slot of max_replication_slots): %w", s, err)
			}
		} else if why, err := SlotUnstreamable(ctx, pool, s, p); err != nil {
			return err
		} else if why != "" {
			// Keeping it would report success on a slot no relay can stream: the relay would
			// stop again with the same error. Dropping it is the operator's call (what it
			// holds is lost), so say the step instead of taking it.
			return fmt.Errorf("outbox: set mode wal: replication slot %s %s: no relay can stream it. Recover: %s",
				s, why, RecoverSlotSteps(schema, true))
		}
	}
	if mode == ModeTable && !force {
		if err := slotDrained(ctx, pool, schema); err != nil {
			return err
		}
	}
	t := tables.For(schema).Outbox
	defer forgetSchema(schema)
	return pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error {
		// No writer inserts while the mode changes; pending rows stay the table relay's.
		if _, err := tx.Exec(ctx, `LOCK TABLE `+t+` IN SHARE ROW EXCLUSIVE MODE`); err != nil {
			return fmt.Errorf("outbox: set mode: lock %s: %w", t, err)
		}
		if mode == ModeWAL {
			var pending bool
			if err := tx.QueryRow(ctx, `SELECT EXISTS (SELECT 1 FROM `+t+` WHERE state IN ('pending', 'packed'))`).Scan(&pending); err != nil {
				return fmt.Errorf("outbox: set mode: %w", err)
			}
			if pending {
				return fmt.Errorf("outbox: set mode wal: %s still holds pending rows; publish them first with the table relay (kafkatx relay --outbox-mode table --exit-when-idle 5s --schema %s), then switch", t, msgfmt.Quote(schema))
			}
		}
		if _, err := tx.Exec(ctx, `SELECT `+tables.For(schema).Func("outbox_set_mode")+`($1, $2, $3)`, string(mode), slot, pub); err != nil {
			return fmt.Errorf("outbox: set mode %s: %w", mode, err)
		}
		return nil
	})
}

// EnsureMode is what a binary started with --outbox-mode want does: want "" accepts the
// stored mode; a mode not chosen yet becomes want (SetMode); a chosen mode other than want is
// an error wrapping ErrModeConflict (the binary exits 2 with it). In WAL mode it also fails
// when the slot is missing. It returns the mode in force.
func EnsureMode(ctx context.Context, pool *pgxpool.Pool, schema string, want Mode) (Mode, error) {
	schema = pg.SchemaOr(schema)
	s, err := ReadSettings(ctx, pool, schema)
	if err != nil {
		return "", err
	}
	switch {
	case want == "" || want == s.Mode:
	case !s.Chosen:
		if err := SetMode(ctx, pool, schema, want); err != nil {
			return "", err
		}
		if s, err = ReadSettings(ctx, pool, schema); err != nil {
			return "", err
		}
	default:
		return "", fmt.Errorf("%w: --outbox-mode %s, but schema %s's outbox is in %s mode (%s)",
			ErrModeConflict, want, schema, s.Mode, SwitchSteps(schema, s.Mode, want))
	}
	if s.Mode == ModeWAL {
		var ok bool
		if err := pool.QueryRow(ctx, `SELECT EXISTS (SELECT 1 FROM pg_replication_slots WHERE slot_name = $1)`, s.Slot).Scan(&ok); err != nil {
			return "", fmt.Errorf("outbox: look for slot %s: %w", s.Slot, err)
		}
		if !ok {
			return "", fmt.Errorf("outbox: schema %s is in WAL mode but its replication slot %s is missing: writers refuse to emit; "+
				"if it was dropped or lost, events not yet relayed are gone (see docs/outbox-wal.md, Recovery); recreate it: %s",
				schema, s.Slot, RecoverSlotSteps(schema, false))
		}
	}
	return s.Mode, nil
}

// RecoverSlotSteps is the one wording of the commands that give schema's WAL outbox a slot
// its relay can stream again: `kafkatx migrate up --outbox-mode wal --schema S` (SetMode
// creates a missing slot), preceded, when drop, by `kafkatx outbox drop-slot --force --schema
// S` for a slot that exists but cannot be streamed (invalidated, or its WAL removed: SetMode
// refuses to keep such a slot). Every message that prints them takes them from here, and
// TestEveryPrintedRecoveryStepRecovers (cmd/kafkatx) follows each literally.
func RecoverSlotSteps(schema string, drop bool) string {
	q := msgfmt.Quote(pg.SchemaOr(schema))
	up := "kafkatx migrate up --outbox-mode wal --schema " + q
	if !drop {
		return up
	}
	return "kafkatx outbox drop-slot --force --schema " + q + ", then " + up
}

// SwitchSteps is the one wording of how to switch schema's outbox from mode from to mode to,
// each command complete: to WAL, publish the table's pending rows with the table relay first
// (SetMode refuses while there are any); to table, drain the slot with the WAL relay first
// (SetMode refuses while the slot, streamed by no relay, holds unpublished records).
func SwitchSteps(schema string, from, to Mode) string {
	q := msgfmt.Quote(pg.SchemaOr(schema))
	up := "kafkatx migrate up --outbox-mode " + string(to) + " --schema " + q
	if from == ModeWAL && to == ModeTable {
		return "drain the slot first: kafkatx relay --exit-when-idle 5s --schema " + q + ", then switch with " + up
	}
	if from == ModeTable && to == ModeWAL {
		return "publish the pending rows first: kafkatx relay --outbox-mode table --exit-when-idle 5s --schema " + q + ", then switch with " + up
	}
	return "switch with " + up
}

// SlotUnstreamable says why slot, which exists, can never be streamed, or "" when it can: its
// wal_status reads lost (invalidated by max_slot_wal_keep_size), or the WAL from its
// restart_lsn was removed on this server (SQLSTATE 58P01 when decoding starts, whatever
// wal_status reads: a slot copied to a promoted standby that lacks its WAL). The second is
// found by peeking at the slot up to its first WAL record (pg_logical_slot_peek_binary_changes
// with pgoutput and publication pub; nothing is consumed); a slot a relay holds
// (SQLSTATE 55006, active) is being streamed and reads "". A missing slot is an error.
func SlotUnstreamable(ctx context.Context, pool *pgxpool.Pool, slot, pub string) (string, error) {
	var status *string
	var active bool
	err := pool.QueryRow(ctx, `SELECT wal_status, active FROM pg_replication_slots WHERE slot_name = $1`, slot).Scan(&status, &active)
	if err != nil {
		return "", fmt.Errorf("outbox: read slot %s: %w", slot, err)
	}
	if status != nil && *status == "lost" {
		return "was invalidated (wal_status lost: it retained more than max_slot_wal_keep_size)", nil
	}
	if active {
		return "", nil
	}
	// upto_lsn 0/1: decoding stops after the first record it reads from restart_lsn.
	_, err = pool.Exec(ctx, `SELECT count(*) FROM pg_logical_slot_peek_binary_changes($1, '0/1', NULL,
		'proto_version', '1', 'publication_names', $2, 'messages', 'true')`, slot, pub)
	var pe *pgconn.PgError
	switch {
	case err == nil:
		return "", nil
	case errors.As(err, &pe) && pe.Code == "58P01":
		return "cannot be streamed: the WAL it needs was removed on this server (" + pe.Message + ")", nil
	case errors.As(err, &pe) && pe.Code == "55006":
		return "", nil // a relay took it meanwhile
	}
	return "", fmt.Errorf("outbox: check that slot %s can be streamed: %w", slot, err)
}

// ErrSlotHoldsRecords is wrapped by the error of SetMode (to table) and DropSlot when the
// schema's replication slot still holds outbox records no relay published (SlotPending):
// switching or dropping then would lose them.
var ErrSlotHoldsRecords = errors.New("the replication slot holds unpublished outbox records")

// SlotPending counts the outbox records of schema still in replication slot slot: the
// transactional logical-decoding messages under schema's prefix (WALPrefix) committed after
// the slot's confirmed_flush_lsn, found by peeking at the slot's pending changes
// (pg_logical_slot_peek_binary_changes with pgoutput, publication pub, messages on; nothing
// is consumed). Only messages count: a slot that lags on other tables' WAL, or on another
// schema's messages, reads 0. The peek decodes all of the slot's pending WAL (its cost grows
// with the lag). active is true, with n 0, when a relay streams the slot now (SQLSTATE 55006:
// it cannot be peeked; that relay publishes what it holds). A slot that does not exist reads
// 0; one that cannot be streamed (SlotUnstreamable) is an error.
func SlotPending(ctx context.Context, q pg.Querier, schema, slot, pub string) (n int64, active bool, err error) {
	prefix := WALPrefix(pg.SchemaOr(schema))
	// pgoutput's message: 'M', flags (1 byte), lsn (8), prefix (NUL-terminated), length, content.
	err = q.QueryRow(ctx, `SELECT count(*) FROM pg_replication_slots s,
		LATERAL pg_logical_slot_peek_binary_changes(s.slot_name, NULL, NULL,
			'proto_version', '1', 'publication_names', $2, 'messages', 'true') c
		WHERE s.slot_name = $1 AND get_byte(c.data, 0) = 77
		AND substring(c.data FROM 11 FOR $4) = convert_to($3, 'UTF8') || '\x00'::bytea`,
		slot, pub, prefix, len(prefix)+1).Scan(&n)
	var pe *pgconn.PgError
	if errors.As(err, &pe) && pe.Code == "55006" {
		return 0, true, nil
	}
	if err != nil {
		return 0, false, fmt.Errorf("outbox: peek at slot %s for unpublished outbox records: %w", slot, err)
	}
	return n, false, nil
}

// DropSlot drops schema's WAL slot (kafkatx outbox drop-slot). What it held and no relay
// published is lost. It fails while a relay streams from the slot, and, unless force, while
// the schema is in WAL mode (writers would then refuse to emit) or while the slot holds
// outbox records no relay published (SlotPending; the error wraps ErrSlotHoldsRecords). It
// returns the slot's name.
func DropSlot(ctx context.Context, q pg.Querier, schema string, force bool) (string, error) {
	s, err := ReadSettings(ctx, q, schema)
	if err != nil {
		return "", err
	}
	if s.Slot == "" {
		return "", fmt.Errorf("outbox: schema %s never had a WAL slot", pg.SchemaOr(schema))
	}
	if s.Mode == ModeWAL && !force {
		return s.Slot, fmt.Errorf("outbox: schema %s is in WAL mode: dropping slot %s stops every writer (they refuse to emit); switch to table mode first or pass --force", pg.SchemaOr(schema), s.Slot)
	}
	if !force {
		n, active, err := SlotPending(ctx, q, schema, s.Slot, s.Publication)
		if err != nil {
			return s.Slot, err
		}
		if active {
			return s.Slot, fmt.Errorf("outbox: drop slot %s: a relay streams from it; stop it once idle, then drop", s.Slot)
		}
		if n > 0 {
			q := msgfmt.Quote(pg.SchemaOr(schema))
			return s.Slot, fmt.Errorf("outbox: drop slot %s: %w (%d): dropping it loses them. Publish them first: "+
				"kafkatx relay --outbox-mode table --exit-when-idle 5s --schema %s, kafkatx migrate up --outbox-mode wal --schema %s, "+
				"kafkatx relay --exit-when-idle 5s --schema %s, then switch back and drop; or pass --force to lose them",
				s.Slot, ErrSlotHoldsRecords, n, q, q, q)
		}
	}
	if _, err := q.Exec(ctx, `SELECT pg_drop_replication_slot(slot_name) FROM pg_replication_slots WHERE slot_name = $1`, s.Slot); err != nil {
		return s.Slot, fmt.Errorf("outbox: drop slot %s: %w", s.Slot, err)
	}
	return s.Slot, nil
}

// CheckWALServer says what the server lacks for WAL mode: PostgreSQL 14 or later (pgoutput's
// messages option), wal_level=logical, the REPLICATION attribute on the current role. nil
// when nothing.
func CheckWALServer(ctx context.Context, q pg.Querier) error {
	var version int
	var level string
	var repl bool
	err := q.QueryRow(ctx, `SELECT current_setting('server_version_num')::int, current_setting('wal_level'),
		(SELECT rolreplication OR rolsuper FROM pg_roles WHERE rolname = current_user)`).Scan(&version, &level, &repl)
	if err != nil {
		return fmt.Errorf("outbox: check the server for WAL mode: %w", err)
	}
	var missing []string
	if version < 140000 {
		missing = append(missing, fmt.Sprintf("PostgreSQL 14 or later (this is %d.%d)", version/10000, version%10000))
	}
	if level != "logical" {
		missing = append(missing, fmt.Sprintf("wal_level=logical (it is %s; set it and restart PostgreSQL)", level))
	}
	if !repl {
		missing = append(missing, "the REPLICATION attribute for the current role (ALTER ROLE ... REPLICATION)")
	}
	if len(missing) > 0 {
		return fmt.Errorf("outbox: WAL mode needs %s", strings.Join(missing, ", and "))
	}
	return nil
}

func isDuplicate(err error) bool {
	var pe *pgconn.PgError
	return errors.As(err, &pe) && pe.Code == "42710"
}

// slotIsOurs refuses slot for schema of database when it is another outbox's: a slot of that
// name in another database (its relay could not stream it here: "was not created in this
// database"), one that is not pgoutput's, or one another schema of this database records as
// its own (two schemas sharing a slot lose events: SlotName). A missing slot is ours to create.
func slotIsOurs(ctx context.Context, pool *pgxpool.Pool, db, schema, slot string) error {
	var slotDB, plugin *string
	err := pool.QueryRow(ctx, `SELECT database, plugin FROM pg_replication_slots WHERE slot_name = $1`, slot).Scan(&slotDB, &plugin)
	if err != nil && !errors.Is(err, pgx.ErrNoRows) {
		return fmt.Errorf("outbox: look for slot %s: %w", slot, err)
	}
	if err == nil {
		switch {
		case slotDB == nil || *slotDB != db:
			return fmt.Errorf("outbox: replication slot %s already exists for database %s, not %s: it is another outbox's (or another tool's); "+
				"drop it there if it is no longer used (kafkatx outbox drop-slot), or give this schema's outbox its own slot", slot, deref(slotDB), db)
		case plugin == nil || *plugin != "pgoutput":
			return fmt.Errorf("outbox: replication slot %s already exists with plugin %s, not pgoutput: it is not a kafkatx outbox's", slot, deref(plugin))
		}
	}
	other, err := recordedBy(ctx, pool, schema, slot)
	if err != nil {
		return err
	}
	if other != "" {
		return fmt.Errorf("outbox: replication slot %s is schema %s's (its outbox settings record it): two schemas sharing one slot lose each other's events; "+
			"this schema %s cannot take it", slot, other, schema)
	}
	return nil
}

// recordedBy returns the schema other than schema whose outbox settings record slot, or "".
// Schemas this role may not read are passed over: their slots cannot be told.
func recordedBy(ctx context.Context, pool *pgxpool.Pool, schema, slot string) (string, error) {
	rows, err := pool.Query(ctx, `SELECT n.nspname FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace
		WHERE c.relname = 'outbox_settings' AND c.relkind = 'r' AND n.nspname <> $1`, schema)
	if err != nil {
		return "", fmt.Errorf("outbox: look for other outboxes: %w", err)
	}
	others, err := pgx.CollectRows(rows, pgx.RowTo[string])
	if err != nil {
		return "", fmt.Errorf("outbox: look for other outboxes: %w", err)
	}
	for _, other := range others {
		if st, err := ReadSettings(ctx, pool, other); err == nil && st.Slot == slot {
			return other, nil
		}
	}
	return "", nil
}

// newNames chooses the slot and publication of a schema that records none: SlotName and
// PublicationName, unless a slot of the name the rule before them gave
// ("kafkatx_<database>_<schema>" without the hash: legacyName) already exists in this
// database for pgoutput and no other schema records it — one declared ahead of the set-up, as
// a Patroni permanent slot by that name is (docs/outbox-wal.md, "Deployment") — which is then
// taken with the publication of the same rule.
func newNames(ctx context.Context, pool *pgxpool.Pool, db, schema string) (slot, pub string, err error) {
	legacy := legacyName("kafkatx_"+db+"_"+schema, db+"/"+schema)
	var exists bool
	if err := pool.QueryRow(ctx, `SELECT EXISTS (SELECT 1 FROM pg_replication_slots WHERE slot_name = $1 AND database = current_database() AND plugin = 'pgoutput')`,
		legacy).Scan(&exists); err != nil {
		return "", "", fmt.Errorf("outbox: look for slot %s: %w", legacy, err)
	}
	if exists {
		other, err := recordedBy(ctx, pool, schema, legacy)
		if err != nil {
			return "", "", err
		}
		if other == "" {
			return legacy, legacyName("kafkatx_outbox_"+schema, schema), nil
		}
	}
	return SlotName(db, schema), PublicationName(schema), nil
}

// identBytes is s lower-cased with every byte outside [a-z0-9_] replaced by "_": the
// readable part of both naming rules.
func identBytes(s string) []byte {
	b := []byte(strings.ToLower(s))
	for i, c := range b {
		if (c < 'a' || c > 'z') && (c < '0' || c > '9') && c != '_' {
			b[i] = '_'
		}
	}
	return b
}

// legacyName is the names' rule before the hash (kept to find a slot declared by it): s
// lower-cased, other bytes "_", past 63 bytes cut to 46 and followed by "_" and 16 hex digits
// of md5(hashOf).
func legacyName(s, hashOf string) string {
	b := identBytes(s)
	if len(b) <= 63 {
		return string(b)
	}
	sum := md5.Sum([]byte(hashOf))
	return string(b[:46]) + "_" + hex.EncodeToString(sum[:])[:16]
}

func deref(s *string) string {
	if s == nil {
		return "(none)"
	}
	return *s
}
