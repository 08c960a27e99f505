// Package parking stores a consumer group's parked keys (table key_parking, migration 013):
// input messages whose key is in trouble, set aside so that the partition's other keys go on.
//
// With kafkatx.Config.ParkKeys on, a message whose handling is to be retried is parked — its
// row written by ParkTx in the unit transaction that also records its offset done
// (offsetstore.Store.MarkDoneXID, fenced on the watermark), so the watermark moves past it —
// and so is every later message of the same key while the key has a parked message. The
// consumer retries each key's head (its lowest parked offset) at its next try; TakeTx deletes
// the head's row in the transaction that holds the handler's effects or its dead letter.
//
// These are not the outbox's parked records (`kafkatx outbox parked`): this package says
// "parked key" and "parked message" throughout.
//
// Conventions (docs/design.md): a function ending in Tx joins the caller's transaction and
// never commits; one taking a pg.Querier runs single statements on what it is given. No call
// writes an audit row: auditing an operator's action (who, why) is the caller's, in the same
// transaction.
package parking

import (
	"context"
	"crypto/sha256"
	"encoding/binary"
	"errors"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/kafkatx/kafkatx/pg"

	"github.com/kafkatx/kafkatx/internal/tables"
)

// ErrGone means the parked message is no longer parked: another owner of the partition (a
// rebalance, a zombie) or an operator took it first. The caller rolls its transaction back.
var ErrGone = errors.New("parked message gone: another owner or an operator took it")

// MaxErrorBytes bounds a stored last error (the rest is cut, as dead letters cut theirs).
const MaxErrorBytes = 4096

// Header is one record header, kept byte for byte.
type Header struct {
	Key   string
	Value []byte
}

// Message is one parked message of a consumer group's partition.
type Message struct {
	Group     string
	Topic     string
	Partition int32
	Offset    int64
	// TopicID and ClusterID name the log the message was read from (the watermark's, as
	// dead letters record them; "" unknown).
	TopicID   string
	ClusterID string
	// KeyHash is KeyHash(Key, Offset): the key's identity in indexes and in memory.
	KeyHash []byte
	Key     []byte // nil for a nil key
	Value   []byte // nil for a tombstone
	Headers []Header
	// Timestamp is the record's own (zero when it had none).
	Timestamp time.Time
	// Attempts is how many tries failed so far (a try ended by Unavailable is not counted).
	Attempts int
	// FirstFailureAt is the first failed try's time (zero: none yet, a message parked behind
	// its key's head without running).
	FirstFailureAt time.Time
	// ErrorClass and LastError describe the last failed try ("" none): why the key is parked.
	ErrorClass string
	LastError  string
	// NextTry is when the head is tried next; zero for a message behind its key's head (it
	// runs once the messages before it are done).
	NextTry  time.Time
	ParkedAt time.Time
}

// KeyHash is a parked message's key identity: sha256 of key, or, for a nil key (nil keys
// have no order among themselves), of its offset with a prefix no key hash can take, so each
// nil-key message is a key of its own. 32 bytes.
func KeyHash(key []byte, offset int64) []byte {
	if key == nil {
		var b [9]byte
		b[0] = 0xff
		binary.BigEndian.PutUint64(b[1:], uint64(offset))
		s := sha256.Sum256(append([]byte("kafkatx nil key "), b[:]...))
		return s[:]
	}
	s := sha256.Sum256(key)
	return s[:]
}

// Store reads and writes the parked keys of one schema.
type Store struct{ t tables.Names }

// New returns the store of schema ("" is pg.DefaultSchema).
func New(schema string) *Store { return &Store{t: tables.For(pg.SchemaOr(schema))} }

// ParkTx writes m as parked in tx. It does not fence: the caller records m's offset done in
// the same transaction (offsetstore.Store.MarkDoneXID, fenced on the watermark), so that a
// second owner of the offset rolls back. A message already parked at m's offset in m's log is
// an error (the primary key): it must never be parked twice.
func (s *Store) ParkTx(ctx context.Context, tx pgx.Tx, m Message) error {
	hk := make([][]byte, len(m.Headers))
	hv := make([][]byte, len(m.Headers))
	for i, h := range m.Headers {
		hk[i], hv[i] = []byte(h.Key), h.Value
	}
	_, err := tx.Exec(ctx, `INSERT INTO `+s.t.KeyParking+` (group_id, topic, partition, "offset", topic_id, cluster_id, key_hash, key, value,
			header_keys, header_values, message_time, attempts, first_failure_at, error_class, last_error, next_try)
		VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11, $12, $13, $14, $15, $16, $17)`,
		m.Group, m.Topic, m.Partition, m.Offset, m.TopicID, m.ClusterID, m.KeyHash, m.Key, m.Value, hk, hv,
		timeOrNil(m.Timestamp), m.Attempts, timeOrNil(m.FirstFailureAt), pg.SanitizeText(m.ErrorClass, 64),
		pg.SanitizeText(m.LastError, MaxErrorBytes), timeOrNil(m.NextTry))
	if err != nil {
		return fmt.Errorf("park %s[%d]@%d: %w", m.Topic, m.Partition, m.Offset, err)
	}
	return nil
}

const cols = `group_id, topic, partition, "offset", topic_id, cluster_id, key_hash, key, value, header_keys, header_values,
	coalesce(message_time, 'epoch'), attempts, coalesce(first_failure_at, 'epoch'), error_class, last_error, coalesce(next_try, 'epoch'), parked_at`

func scan(row pgx.Row) (Message, error) {
	var m Message
	var hk, hv [][]byte
	if err := row.Scan(&m.Group, &m.Topic, &m.Partition, &m.Offset, &m.TopicID, &m.ClusterID, &m.KeyHash, &m.Key, &m.Value, &hk, &hv,
		&m.Timestamp, &m.Attempts, &m.FirstFailureAt, &m.ErrorClass, &m.LastError, &m.NextTry, &m.ParkedAt); err != nil {
		return m, err
	}
	for i := range hk {
		h := Header{Key: string(hk[i])}
		if i < len(hv) {
			h.Value = hv[i]
		}
		m.Headers = append(m.Headers, h)
	}
	for _, t := range []*time.Time{&m.Timestamp, &m.FirstFailureAt, &m.NextTry} {
		if t.Unix() == 0 {
			*t = time.Time{}
		}
	}
	return m, nil
}

// Due returns, in next-try order, up to limit heads of the partition's parked keys whose
// next try is at or before at: a head is a key's lowest parked offset; one with no next try
// (its key's earlier messages are done) is due at once. It reads without locking: a head may
// be taken by another owner before the caller runs it (TakeTx then answers ErrGone).
func (s *Store) Due(ctx context.Context, q pg.Querier, group, topic string, partition int32, at time.Time, limit int) ([]Message, error) {
	rows, err := q.Query(ctx, `SELECT `+cols+` FROM (
			SELECT DISTINCT ON (key_hash) * FROM `+s.t.KeyParking+`
			WHERE group_id = $1 AND topic = $2 AND partition = $3 ORDER BY key_hash, "offset") h
		WHERE next_try IS NULL OR next_try <= $4 ORDER BY next_try NULLS FIRST, "offset" LIMIT $5`,
		group, topic, partition, at, limit)
	if err != nil {
		return nil, fmt.Errorf("read due parked keys %s[%d]: %w", topic, partition, err)
	}
	defer rows.Close()
	var out []Message
	for rows.Next() {
		m, err := scan(rows)
		if err != nil {
			return nil, fmt.Errorf("read due parked keys %s[%d]: %w", topic, partition, err)
		}
		out = append(out, m)
	}
	return out, rows.Err()
}

// NextDue is the earliest next try of the partition's heads (zero when none is parked; a head
// due at once gives its parked time).
func (s *Store) NextDue(ctx context.Context, q pg.Querier, group, topic string, partition int32) (time.Time, error) {
	var t *time.Time
	err := q.QueryRow(ctx, `SELECT min(coalesce(next_try, parked_at)) FROM (
			SELECT DISTINCT ON (key_hash) next_try, parked_at FROM `+s.t.KeyParking+`
			WHERE group_id = $1 AND topic = $2 AND partition = $3 ORDER BY key_hash, "offset") h`,
		group, topic, partition).Scan(&t)
	if err != nil {
		return time.Time{}, fmt.Errorf("read next parked try %s[%d]: %w", topic, partition, err)
	}
	if t == nil {
		return time.Time{}, nil
	}
	return *t, nil
}

// Counts returns the number of parked messages of each parked key of the partition, by
// string(KeyHash): what a consumer loads at assignment (key hashes and counts only, so its
// memory does not grow with the parked messages' sizes).
func (s *Store) Counts(ctx context.Context, q pg.Querier, group, topic string, partition int32) (map[string]int, error) {
	rows, err := q.Query(ctx, `SELECT key_hash, count(*) FROM `+s.t.KeyParking+`
		WHERE group_id = $1 AND topic = $2 AND partition = $3 GROUP BY key_hash`, group, topic, partition)
	if err != nil {
		return nil, fmt.Errorf("read parked keys %s[%d]: %w", topic, partition, err)
	}
	defer rows.Close()
	out := map[string]int{}
	for rows.Next() {
		var h []byte
		var n int
		if err := rows.Scan(&h, &n); err != nil {
			return nil, fmt.Errorf("read parked keys %s[%d]: %w", topic, partition, err)
		}
		out[string(h)] = n
	}
	return out, rows.Err()
}

// TakeTx deletes the parked message at offset of the partition in tx — the head a consumer
// ran, in the transaction of its handler's effects or its dead letter — and returns
// ErrGone when no such row is there (another owner or an operator took it: the caller rolls
// back). This delete is the fence of a parked message's run: a second transaction deleting
// the same row waits for the first and then finds nothing.
func (s *Store) TakeTx(ctx context.Context, tx pgx.Tx, group, topic string, partition int32, offset int64) error {
	tag, err := tx.Exec(ctx, `DELETE FROM `+s.t.KeyParking+` WHERE group_id = $1 AND topic = $2 AND partition = $3 AND "offset" = $4`,
		group, topic, partition, offset)
	if err != nil {
		return fmt.Errorf("take parked %s[%d]@%d: %w", topic, partition, offset, err)
	}
	if tag.RowsAffected() == 0 {
		return ErrGone
	}
	return nil
}

// Failed records a failed try of the parked head at offset: attempts becomes attempts, the
// error class and text are kept, the next try set to next. A try that spends no attempt
// (Unavailable) passes the head's current count. ErrGone when the row is not there.
func (s *Store) Failed(ctx context.Context, q pg.Querier, group, topic string, partition int32, offset int64, attempts int, class, msg string, next time.Time) error {
	tag, err := q.Exec(ctx, `UPDATE `+s.t.KeyParking+` SET attempts = $5, error_class = $6, last_error = $7, next_try = $8,
			first_failure_at = coalesce(first_failure_at, now())
		WHERE group_id = $1 AND topic = $2 AND partition = $3 AND "offset" = $4`,
		group, topic, partition, offset, attempts, pg.SanitizeText(class, 64), pg.SanitizeText(msg, MaxErrorBytes), next)
	if err != nil {
		return fmt.Errorf("record parked failure %s[%d]@%d: %w", topic, partition, offset, err)
	}
	if tag.RowsAffected() == 0 {
		return ErrGone
	}
	return nil
}

// BeginTry durably records, before the consumer runs the parked head at offset, that try n of
// it is about to run, its outcome unknown: attempts becomes n and the error class empty until
// Failed records the try's outcome or TakeTx deletes the row. A process that dies during the
// try (a message that crashes it) leaves it so: the next owner counts the crash as an attempt
// and dead-letters the message at the bound instead of crashing forever. ErrGone when the row
// is not there.
func (s *Store) BeginTry(ctx context.Context, q pg.Querier, group, topic string, partition int32, offset int64, n int) error {
	tag, err := q.Exec(ctx, `UPDATE `+s.t.KeyParking+` SET attempts = $5, error_class = ''
		WHERE group_id = $1 AND topic = $2 AND partition = $3 AND "offset" = $4`, group, topic, partition, offset, n)
	if err != nil {
		return fmt.Errorf("record parked try %s[%d]@%d: %w", topic, partition, offset, err)
	}
	if tag.RowsAffected() == 0 {
		return ErrGone
	}
	return nil
}

// Key is one parked key of a partition, as an operator sees it.
type Key struct {
	Group     string
	Topic     string
	Partition int32
	KeyHash   []byte
	Key       []byte // nil for a nil key
	// HeadOffset is the key's lowest parked offset, the one tried next; Count its parked
	// messages.
	HeadOffset int64
	Count      int
	// ParkedAt is when the head was parked (the key's age); Attempts, ErrorClass and
	// LastError are the head's; NextTry its next try (zero: at once).
	ParkedAt   time.Time
	Attempts   int
	ErrorClass string
	LastError  string
	NextTry    time.Time
}

// Keys lists the parked keys of a group's topic, head offset first within each partition,
// partitions in order; partition < 0 means every partition, limit ≤ 0 no limit. It reads
// without locking (a snapshot: a key may be released by its consumer meanwhile).
func (s *Store) Keys(ctx context.Context, q pg.Querier, group, topic string, partition int32, limit int) ([]Key, error) {
	lim := any(nil)
	if limit > 0 {
		lim = limit
	}
	rows, err := q.Query(ctx, `SELECT h.group_id, h.topic, h.partition, h.key_hash, h.key, h."offset", c.n, h.parked_at, h.attempts,
			h.error_class, h.last_error, coalesce(h.next_try, 'epoch')
		FROM (SELECT DISTINCT ON (partition, key_hash) * FROM `+s.t.KeyParking+`
			WHERE group_id = $1 AND topic = $2 AND ($3 < 0 OR partition = $3) ORDER BY partition, key_hash, "offset") h
		JOIN (SELECT partition, key_hash, count(*) AS n FROM `+s.t.KeyParking+`
			WHERE group_id = $1 AND topic = $2 AND ($3 < 0 OR partition = $3) GROUP BY partition, key_hash) c
			ON c.partition = h.partition AND c.key_hash = h.key_hash
		ORDER BY h.partition, h."offset" LIMIT $4`, group, topic, partition, lim)
	if err != nil {
		return nil, fmt.Errorf("list parked keys of %s: %w", topic, err)
	}
	defer rows.Close()
	var out []Key
	for rows.Next() {
		var k Key
		if err := rows.Scan(&k.Group, &k.Topic, &k.Partition, &k.KeyHash, &k.Key, &k.HeadOffset, &k.Count, &k.ParkedAt, &k.Attempts,
			&k.ErrorClass, &k.LastError, &k.NextTry); err != nil {
			return nil, fmt.Errorf("list parked keys of %s: %w", topic, err)
		}
		if k.NextTry.Unix() == 0 {
			k.NextTry = time.Time{}
		}
		out = append(out, k)
	}
	return out, rows.Err()
}

// Messages returns a parked key's messages in offset order (keyHash as Key.KeyHash).
func (s *Store) Messages(ctx context.Context, q pg.Querier, group, topic string, partition int32, keyHash []byte) ([]Message, error) {
	rows, err := q.Query(ctx, `SELECT `+cols+` FROM `+s.t.KeyParking+`
		WHERE group_id = $1 AND topic = $2 AND partition = $3 AND key_hash = $4 ORDER BY "offset"`, group, topic, partition, keyHash)
	if err != nil {
		return nil, fmt.Errorf("read parked key %s[%d]: %w", topic, partition, err)
	}
	defer rows.Close()
	var out []Message
	for rows.Next() {
		m, err := scan(rows)
		if err != nil {
			return nil, fmt.Errorf("read parked key %s[%d]: %w", topic, partition, err)
		}
		out = append(out, m)
	}
	return out, rows.Err()
}

// Release makes a parked key's head due now (an operator's "try it now"): its next try is set
// to now(), its attempts kept. It returns false when the key has no parked message. The
// running consumer of the partition picks it up at its next look (within a second or so); it
// still runs the key's messages in offset order, one owner at a time (TakeTx fences).
func (s *Store) Release(ctx context.Context, q pg.Querier, group, topic string, partition int32, keyHash []byte) (bool, error) {
	tag, err := q.Exec(ctx, `UPDATE `+s.t.KeyParking+` SET next_try = now()
		WHERE group_id = $1 AND topic = $2 AND partition = $3 AND "offset" = (SELECT min("offset") FROM `+s.t.KeyParking+`
			WHERE group_id = $1 AND topic = $2 AND partition = $3 AND key_hash = $4)`, group, topic, partition, keyHash)
	if err != nil {
		return false, fmt.Errorf("release parked key %s[%d]: %w", topic, partition, err)
	}
	return tag.RowsAffected() > 0, nil
}

// TakeKeyTx deletes in tx a parked key's head (all false) or every message of the key (all
// true), locking them first, and calls write for each in offset order — the caller writes its
// dead letter there (engine.NewDeadLetter, engine.DeadLetterTx) and its audit row, in the
// same transaction, and commits. It returns how many it took. A row a consumer is running
// concurrently is waited for (the consumer's TakeTx or this one wins; the loser's
// transaction finds no row). The running consumer notices the key's messages gone at its next
// look and carries on with the key's next message, if any.
func (s *Store) TakeKeyTx(ctx context.Context, tx pgx.Tx, group, topic string, partition int32, keyHash []byte, all bool, write func(Message) error) (int, error) {
	lim := any(1)
	if all {
		lim = nil
	}
	rows, err := tx.Query(ctx, `DELETE FROM `+s.t.KeyParking+` WHERE (group_id, topic, partition, "offset", cluster_id, topic_id) IN (
			SELECT group_id, topic, partition, "offset", cluster_id, topic_id FROM `+s.t.KeyParking+`
			WHERE group_id = $1 AND topic = $2 AND partition = $3 AND key_hash = $4 ORDER BY "offset" LIMIT $5 FOR UPDATE)
		RETURNING `+cols, group, topic, partition, keyHash, lim)
	if err != nil {
		return 0, fmt.Errorf("take parked key %s[%d]: %w", topic, partition, err)
	}
	var ms []Message
	for rows.Next() {
		m, err := scan(rows)
		if err != nil {
			rows.Close()
			return 0, fmt.Errorf("take parked key %s[%d]: %w", topic, partition, err)
		}
		ms = append(ms, m)
	}
	rows.Close()
	if err := rows.Err(); err != nil {
		return 0, fmt.Errorf("take parked key %s[%d]: %w", topic, partition, err)
	}
	sortByOffset(ms)
	for _, m := range ms {
		if err := write(m); err != nil {
			return 0, err
		}
	}
	return len(ms), nil
}

// Partition is one partition's parked totals.
type Partition struct {
	Group     string
	Topic     string
	Partition int32
	Keys      int
	Messages  int
	// Oldest is the oldest parked message's parked time (zero when none).
	Oldest time.Time
}

// Totals returns the parked keys and messages of each of a group's partitions that has any
// (topic "" means every topic of the group), for status reports and metrics.
func (s *Store) Totals(ctx context.Context, q pg.Querier, group, topic string) ([]Partition, error) {
	rows, err := q.Query(ctx, `SELECT group_id, topic, partition, count(DISTINCT key_hash), count(*), min(parked_at) FROM `+s.t.KeyParking+`
		WHERE group_id = $1 AND ($2 = '' OR topic = $2) GROUP BY group_id, topic, partition ORDER BY topic, partition`, group, topic)
	if err != nil {
		return nil, fmt.Errorf("read parked totals of %s: %w", group, err)
	}
	defer rows.Close()
	var out []Partition
	for rows.Next() {
		var p Partition
		if err := rows.Scan(&p.Group, &p.Topic, &p.Partition, &p.Keys, &p.Messages, &p.Oldest); err != nil {
			return nil, fmt.Errorf("read parked totals of %s: %w", group, err)
		}
		out = append(out, p)
	}
	return out, rows.Err()
}

// Offsets returns the parked offsets of a partition in [from, to) in order (to < 0: no upper
// bound), for offset accounting: a parked offset is below the watermark and accounted for.
func (s *Store) Offsets(ctx context.Context, q pg.Querier, group, topic string, partition int32, from, to int64) ([]int64, error) {
	rows, err := q.Query(ctx, `SELECT "offset" FROM `+s.t.KeyParking+`
		WHERE group_id = $1 AND topic = $2 AND partition = $3 AND "offset" >= $4 AND ($5 < 0 OR "offset" < $5) ORDER BY 1`,
		group, topic, partition, from, to)
	if err != nil {
		return nil, fmt.Errorf("read parked offsets %s[%d]: %w", topic, partition, err)
	}
	out, err := pgx.CollectRows(rows, pgx.RowTo[int64])
	if err != nil {
		return nil, fmt.Errorf("read parked offsets %s[%d]: %w", topic, partition, err)
	}
	return out, nil
}

// DeleteTx deletes the partition's parked messages at offsets ≥ from in tx (from < 0: all of
// them): what an operator's reset does with parked messages it replays or skips (the caller
// audits). It returns how many.
func (s *Store) DeleteTx(ctx context.Context, tx pgx.Tx, group, topic string, partition int32, from int64) (int64, error) {
	tag, err := tx.Exec(ctx, `DELETE FROM `+s.t.KeyParking+` WHERE group_id = $1 AND topic = $2 AND partition = $3 AND "offset" >= $4`,
		group, topic, partition, max(from, 0))
	if err != nil {
		return 0, fmt.Errorf("delete parked %s[%d]: %w", topic, partition, err)
	}
	return tag.RowsAffected(), nil
}

func sortByOffset(ms []Message) {
	for i := 1; i < len(ms); i++ {
		for j := i; j > 0 && ms[j].Offset < ms[j-1].Offset; j-- {
			ms[j], ms[j-1] = ms[j-1], ms[j]
		}
	}
}

func timeOrNil(t time.Time) any {
	if t.IsZero() {
		return nil
	}
	return t
}
