package outbox

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"sync"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/kafkatx/kafkatx/internal/tables"
)

// WALPrefix is the logical-decoding message prefix of schema's records (the schema's
// outbox_wal_prefix function): "kafkatx.outbox:<schema>".
func WALPrefix(schema string) string { return "kafkatx.outbox:" + schema }

// AppendWAL appends record r encoded as one WAL-mode message to b (the schema's
// outbox_wal_encode function writes the same bytes): version byte 1; topic, key and value each
// as a big-endian int32 length (-1 for a nil key or value) and the bytes; the partition as an
// int32 (-1: the partitioner's); the header count as an int32, then each header's key and
// value as length and bytes (a nil header value is stored empty).
func AppendWAL(b []byte, r *Record) []byte {
	return appendRecord(append(b, 1), r)
}

func appendRecord(b []byte, r *Record) []byte {
	b = appendBytes(b, []byte(r.Topic), false)
	b = appendBytes(b, r.Key, r.Key == nil)
	b = appendBytes(b, r.Value, r.Value == nil)
	p := int32(-1)
	if r.Partition != nil {
		p = *r.Partition
	}
	b = binary.BigEndian.AppendUint32(b, uint32(p))
	b = binary.BigEndian.AppendUint32(b, uint32(len(r.Headers)))
	for _, h := range r.Headers {
		b = appendBytes(b, []byte(h.Key), false)
		b = appendBytes(b, h.Value, false)
	}
	return b
}

func appendBytes(b, v []byte, null bool) []byte {
	if null {
		return binary.BigEndian.AppendUint32(b, ^uint32(0))
	}
	b = binary.BigEndian.AppendUint32(b, uint32(len(v)))
	return append(b, v...)
}

// ErrMalformedWAL wraps the errors of DecodeWAL and RangeWAL for bytes that are not a
// well-formed WAL-mode message.
var ErrMalformedWAL = errors.New("outbox: malformed WAL message")

// DecodeWAL decodes a message AppendWAL wrote. The record's slices point into b.
func DecodeWAL(b []byte) (Record, error) {
	if len(b) < 1 || b[0] != 1 {
		return Record{}, fmt.Errorf("%w: not a single record (format version 1)", ErrMalformedWAL)
	}
	d := walDecoder{b: b[1:]}
	r := d.record()
	if d.err == nil && len(d.b) != 0 {
		d.err = fmt.Errorf("%d bytes past the record", len(d.b))
	}
	if d.err != nil {
		return Record{}, fmt.Errorf("%w: %w", ErrMalformedWAL, d.err)
	}
	return r, nil
}

// RangeWAL calls f for each record of a WAL-mode message in order: one record (format
// version 1, AppendWAL, the table trigger's) or several (version 2: a big-endian uint32 count,
// then each record as in version 1 without the version byte; what WriteTx emits). The
// records' slices point into b. It stops at f's first error and returns it, or at a malformed
// record (an error naming it; the records before it were passed to f).
func RangeWAL(b []byte, f func(i int, r Record) error) error {
	if len(b) < 1 {
		return fmt.Errorf("%w: empty", ErrMalformedWAL)
	}
	switch b[0] {
	case 1:
		r, err := DecodeWAL(b)
		if err != nil {
			return err
		}
		return f(0, r)
	case 2:
		d := walDecoder{b: b[1:]}
		n := d.u32()
		for i := 0; d.err == nil && uint32(i) < n; i++ {
			r := d.record()
			if d.err != nil {
				return fmt.Errorf("%w: record %d: %w", ErrMalformedWAL, i, d.err)
			}
			if err := f(i, r); err != nil {
				return err
			}
		}
		if d.err == nil && len(d.b) != 0 {
			d.err = fmt.Errorf("%d bytes past the records", len(d.b))
		}
		if d.err != nil {
			return fmt.Errorf("%w: %w", ErrMalformedWAL, d.err)
		}
		return nil
	}
	return fmt.Errorf("%w: unknown format version %d", ErrMalformedWAL, b[0])
}

// record decodes one record (without the version byte).
func (d *walDecoder) record() Record {
	var r Record
	t, _ := d.bytes()
	if string(t) == d.last { // one string per run of records to the same topic
		r.Topic = d.last
	} else {
		r.Topic = string(t)
		d.last = r.Topic
	}
	r.Key, _ = d.bytes()
	r.Value, _ = d.bytes()
	if p := int32(d.u32()); p >= 0 {
		r.Partition = &p
	}
	n := d.u32()
	if d.err == nil && uint64(n) > uint64(len(d.b)/8) {
		d.err = errors.New("header count past the message's end")
	}
	if d.err == nil && n > 0 {
		r.Headers = make([]Header, n)
		for i := range r.Headers {
			k, _ := d.bytes()
			v, _ := d.bytes()
			r.Headers[i] = Header{Key: string(k), Value: v}
		}
	}
	if d.err == nil && r.Topic == "" {
		d.err = errors.New("no topic")
	}
	return r
}

type walDecoder struct {
	b    []byte
	err  error
	last string
}

func (d *walDecoder) u32() uint32 {
	if d.err != nil {
		return 0
	}
	if len(d.b) < 4 {
		d.err = errors.New("truncated")
		return 0
	}
	v := binary.BigEndian.Uint32(d.b)
	d.b = d.b[4:]
	return v
}

func (d *walDecoder) bytes() ([]byte, bool) {
	n := d.u32()
	if d.err != nil || n == ^uint32(0) {
		return nil, false
	}
	if uint64(n) > uint64(len(d.b)) {
		d.err = errors.New("truncated")
		return nil, false
	}
	v := d.b[:n:n]
	d.b = d.b[n:]
	return v, true
}

// walMessageBytes bounds a version-2 message: WriteTx starts a new one past it, so neither
// the server nor the relay holds more than about this much of one call at once.
const walMessageBytes = 256 << 10

// writeWAL emits records as transactional logical-decoding messages through the schema's
// outbox_emit function (one round trip), which first checks that the schema is in WAL mode
// and that its slot exists. Records go several to a message (format version 2, up to about
// 256 KiB each): the walsender sends each message on its own, so one per record costs a
// send per record (measured in docs/benchmarks-history.md, "The outbox through the WAL"). It
// returns, for record i of n in a message whose WAL record ends at LSN L (what
// pg_logical_emit_message returns), L - (n-1) + i:
// ascending, and unique in the cluster, since each record takes more than one byte of that
// WAL record.
func (w Writer) writeWAL(ctx context.Context, tx pgx.Tx, records []Record) ([]int64, error) {
	size := 0
	for i := range records {
		size += 20 + len(records[i].Topic) + len(records[i].Key) + len(records[i].Value)
		for _, h := range records[i].Headers {
			size += 8 + len(h.Key) + len(h.Value)
		}
	}
	buf := make([]byte, 0, size+5*(1+size/walMessageBytes))
	var msgs [][]byte
	var counts []int
	start, n := 0, 0
	flush := func() {
		binary.BigEndian.PutUint32(buf[start+1:], uint32(n))
		msgs, counts = append(msgs, buf[start:len(buf):len(buf)]), append(counts, n)
	}
	for i := range records {
		if n == 0 {
			start = len(buf)
			buf = append(buf, 2, 0, 0, 0, 0)
		}
		buf = appendRecord(buf, &records[i])
		n++
		if len(buf)-start >= walMessageBytes {
			flush()
			n = 0
		}
	}
	if n > 0 {
		flush()
	}
	var lsns []int64
	err := tx.QueryRow(ctx, `SELECT `+tables.For(w.schema()).Func("outbox_emit")+`($1::bytea[])`, msgs).Scan(&lsns)
	if err != nil {
		var pe *pgconn.PgError
		if errors.As(err, &pe) && (pe.Code == "KX001" || pe.Code == "KX002") {
			forgetMode(tx, w.schema())
		}
		return nil, fmt.Errorf("outbox: emit %d records: %w", len(records), err)
	}
	if len(lsns) != len(msgs) {
		return nil, fmt.Errorf("outbox: emit %d records: got %d positions for %d messages", len(records), len(lsns), len(msgs))
	}
	ids := make([]int64, 0, len(records))
	for m, l := range lsns {
		for i := 0; i < counts[m]; i++ {
			ids = append(ids, l-int64(counts[m]-1)+int64(i))
		}
	}
	return ids, nil
}

// modeTTL is how long a writer trusts the outbox mode it read. A writer on a stale table mode
// still works (in WAL mode the table's trigger turns its rows into messages); one on a stale
// WAL mode is refused by outbox_emit, forgets the mode and fails its transaction.
const modeTTL = 2 * time.Second

type modeKey struct{ host, db, schema string }

type modeEntry struct {
	mode Mode
	at   time.Time
}

var modes sync.Map // modeKey -> modeEntry

func keyOf(tx pgx.Tx, schema string) modeKey {
	if tx.Conn() == nil { // a wrapped transaction that hides its connection
		return modeKey{schema: schema}
	}
	c := tx.Conn().Config()
	return modeKey{host: fmt.Sprintf("%s:%d", c.Host, c.Port), db: c.Database, schema: schema}
}

func forgetMode(tx pgx.Tx, schema string) { modes.Delete(keyOf(tx, schema)) }

// forgetSchema drops what this process cached of schema's mode, in every database.
func forgetSchema(schema string) {
	modes.Range(func(k, _ any) bool {
		if k.(modeKey).schema == schema {
			modes.Delete(k)
		}
		return true
	})
}

// mode returns the schema's outbox mode, read in tx at most every modeTTL.
func (w Writer) mode(ctx context.Context, tx pgx.Tx) (Mode, error) {
	k := keyOf(tx, w.schema())
	if e, ok := modes.Load(k); ok && time.Since(e.(modeEntry).at) < modeTTL {
		return e.(modeEntry).mode, nil
	}
	s, err := ReadSettings(ctx, tx, w.schema())
	if err != nil {
		return "", err
	}
	modes.Store(k, modeEntry{mode: s.Mode, at: time.Now()})
	return s.Mode, nil
}
