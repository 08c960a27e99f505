package idempotency

import (
	"bytes"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"strings"
)

// ErrNotAChange is returned (wrapped) by FromDebezium and ParseDebezium for a record that
// carries no change: a tombstone (empty value, or a JSON converter envelope whose payload is
// null), a heartbeat or transaction-metadata record (a value with neither source nor op), or
// a schema-change record (a source block but no op). The kafkatx consumer skips such a record
// without running the handler and counts it in Stats.NotChanges; it is never dead-lettered.
// Test for it with errors.Is.
var ErrNotAChange = errors.New("idempotency: not a change event")

// DebeziumKeyPrefix starts every key of the current format (see DebeziumEvent.Key). Keys of
// the first format (DebeziumEvent.Position, "pg:…", "mysql:…", "sqlserver:…") never start
// with it, so a claim of one format never absorbs a record keyed in the other.
const DebeziumKeyPrefix = "dbz2:"

// DebeziumEvent is a decoded Debezium change event value (the envelope with before, after,
// source, op and ts_ms), with or without the JSON converter's {"schema", "payload"} wrapper.
// Before, After, Transaction and Message are raw JSON (nil or JSON null when absent).
type DebeziumEvent struct {
	Op     string                     `json:"op"`
	Before json.RawMessage            `json:"before"`
	After  json.RawMessage            `json:"after"`
	Source map[string]json.RawMessage `json:"source"`
	TsMs   json.Number                `json:"ts_ms"`
	// Transaction is the transaction block ({"id", "total_order", "data_collection_order"})
	// the connector adds with provide.transaction.metadata=true; JSON null or nil otherwise.
	Transaction json.RawMessage `json:"transaction"`
	// Message is a logical decoding message's {"prefix", "content"} (op "m" only).
	Message json.RawMessage `json:"message"`
}

// ParseDebezium decodes a Debezium change event value produced by the JSON converter, with
// schemas enabled ({"schema": ..., "payload": {envelope}}) or not ({envelope}). A record that
// is not a change — an empty or JSON null value (tombstone), a null payload, a value with neither source
// nor op (heartbeat, transaction metadata), a source without op (schema change) — gives an
// error wrapping ErrNotAChange. A value that is not a JSON object, or an event with an op but
// no source block, is another error (malformed).
func ParseDebezium(value []byte) (*DebeziumEvent, error) {
	if isNull(value) {
		return nil, fmt.Errorf("debezium: empty or null value (a tombstone): %w", ErrNotAChange)
	}
	var outer map[string]json.RawMessage
	if err := json.Unmarshal(value, &outer); err != nil || outer == nil {
		return nil, errors.New("debezium: value is not a JSON object")
	}
	body := value
	if p, ok := outer["payload"]; ok && outer["source"] == nil && outer["op"] == nil {
		if isNull(p) {
			return nil, fmt.Errorf("debezium: payload is null (a tombstone): %w", ErrNotAChange)
		}
		body = p
	}
	dec := json.NewDecoder(bytes.NewReader(body))
	dec.UseNumber()
	var ev DebeziumEvent
	if err := dec.Decode(&ev); err != nil {
		return nil, fmt.Errorf("debezium: decode envelope: %w", err)
	}
	switch {
	case ev.Source == nil && ev.Op == "":
		return nil, fmt.Errorf("debezium: no source and no op (a heartbeat or transaction-metadata record): %w", ErrNotAChange)
	case ev.Source == nil:
		return nil, fmt.Errorf("debezium: op %q without a source block", ev.Op)
	case ev.Op == "":
		return nil, fmt.Errorf("debezium: source block without op (a schema-change record): %w", ErrNotAChange)
	}
	return &ev, nil
}

// Snapshot reports whether the event was read by a snapshot (op "r", or source.snapshot set
// to anything but false). Key treats only op "r" as a snapshot read.
func (e *DebeziumEvent) Snapshot() bool {
	if e.Op == "r" {
		return true
	}
	switch string(bytes.TrimSpace(e.Source["snapshot"])) {
	case "", "null", "false", `"false"`, `""`:
		return false
	}
	return true
}

// Connector returns source.connector ("postgresql", "mysql", "sqlserver", ...), or, when
// absent, the connector whose position fields the source block carries.
func (e *DebeziumEvent) Connector() string {
	if c, ok, _ := jsonScalar(e.Source["connector"]); ok {
		return c
	}
	switch {
	case e.Source["lsn"] != nil:
		return "postgresql"
	case e.Source["file"] != nil && e.Source["pos"] != nil:
		return "mysql"
	case e.Source["change_lsn"] != nil || e.Source["commit_lsn"] != nil:
		return "sqlserver"
	}
	return ""
}

// TotalOrder returns transaction.total_order (the event's position within its transaction,
// from 1) and whether the event carries one (provide.transaction.metadata=true, streamed
// changes only).
func (e *DebeziumEvent) TotalOrder() (string, bool) {
	if isNull(e.Transaction) {
		return "", false
	}
	var t map[string]json.RawMessage
	if json.Unmarshal(e.Transaction, &t) != nil {
		return "", false
	}
	s, ok, err := jsonScalar(t["total_order"])
	return s, ok && err == nil && s != ""
}

func (e *DebeziumEvent) src(name string) string {
	s, _, _ := jsonScalar(e.Source[name])
	return s
}

func (e *DebeziumEvent) need(names ...string) error {
	for _, n := range names {
		if s, ok, err := jsonScalar(e.Source[n]); err != nil || !ok || s == "" {
			return fmt.Errorf("debezium: source.%s is missing or not a string or number", n)
		}
	}
	return nil
}

// place returns the connector's short name, the escaped server name and the escaped data
// collection ("<db>.<schema>.<table>", MySQL "<db>.<table>").
func (e *DebeziumEvent) place() (conn, name, coll string, err error) {
	name = esc(e.src("name"))
	db, schema, table := esc(e.src("db")), esc(e.src("schema")), esc(e.src("table"))
	switch c := e.Connector(); c {
	case "postgresql":
		return "pg", name, db + "." + schema + "." + table, nil
	case "mysql":
		return "mysql", name, db + "." + table, nil
	case "sqlserver":
		return "sqlserver", name, db + "." + schema + "." + table, nil
	case "":
		return "", "", "", errors.New("debezium: source has no connector and no known position fields")
	default:
		return "", "", "", fmt.Errorf("debezium: connector %q is not supported for source-position keys; use FromHeader or FromJSONField", c)
	}
}

// position returns the connector's source position of a streamed change, ':'-joined.
func (e *DebeziumEvent) position(conn string) (string, error) {
	switch conn {
	case "pg":
		// txId is null for a non-transactional logical message; lsn alone then places it.
		if err := e.need("lsn"); err != nil {
			return "", err
		}
		return e.src("lsn") + ":" + e.src("txId"), nil
	case "mysql":
		if err := e.need("file", "pos"); err != nil {
			return "", err
		}
		row := e.src("row")
		if row == "" {
			row = "0"
		}
		return strings.Join([]string{e.src("server_id"), colonEscaper.Replace(e.src("file")), e.src("pos"), row}, ":"), nil
	default: // sqlserver
		if err := e.need("change_lsn"); err != nil {
			return "", err
		}
		return strings.Join([]string{e.src("commit_lsn"), e.src("change_lsn"), e.src("event_serial_no")}, ":"), nil
	}
}

// Key returns the event's idempotency key in the current format (DebeziumKeyPrefix). It
// identifies the change, not only its place in the log: every copy of one change (re-sent by
// a restarted connector, re-published at another offset, converted with key schemas on or
// off) gets the same key, and two changes get two keys. recordKey is the Kafka record key as
// the connector wrote it (nil for a table without a primary key or replica identity).
//
// Streamed changes (op "c", "u", "d", "t", "m"):
//
//	dbz2:<conn>:<name>:<collection>:<op>:<position>:<order>:<row>
//
// where
//
//   - conn, position: "pg" with source.lsn and source.txId ("<lsn>:<txId>", txId empty for
//     a non-transactional message); "mysql" with server_id, file, pos and row; "sqlserver"
//     with commit_lsn, change_lsn and event_serial_no. source.sequence is not used: its first
//     element (the last commit's LSN) can differ between a change and its re-sent copy.
//   - collection: "<db>.<schema>.<table>" (MySQL "<db>.<table>"), percent-escaped; op and
//     collection tell apart the events of one WAL record (a TRUNCATE of several tables, a
//     primary-key update's delete and create).
//   - order: "o" + transaction.total_order when the connector adds transaction metadata,
//     else "-".
//   - row: "k" + the digest of the record key's payload (unwrapped from the JSON
//     converter's {"schema", "payload"} and canonicalised, so key schemas on or off give one
//     key): the rows of one COPY or multi-row INSERT share lsn and txId and differ here.
//     Without a record key (a keyless table): "-" when order is present; otherwise "i" + the
//     digest of the before and after images — the documented limit: two identical rows
//     written by one COPY into a keyless table, without transaction metadata, get one key.
//     A truncate ("t") has no row: "-". A logical message ("m"): "m" + the digest of its
//     prefix and content.
//
// Snapshot reads (op "r", initial, blocking or incremental): a snapshot's position (often
// null, and new when an interrupted snapshot is restarted) does not identify the read, so
//
//	dbz2:<conn>:<name>:<collection>:r:snap:<row>:a<digest of the after image>
//
// with row as above ("k…", or "-" without a record key). The same row read again with the
// same content (a snapshot restarted after a crash, a second snapshot of an unchanged table)
// gets the same key and is absorbed; a changed row, or a streamed change of it, gets a new
// one. Limit: identical rows of a keyless table read by one snapshot share a key.
//
// Digests are the first 16 bytes, in hex, of the SHA-256 of canonical JSON (object members
// sorted, numbers kept as written) or, for a record key that is not JSON, of its bytes.
// Errors: an op other than the six above, a missing position field, an unsupported
// connector (mongodb, oracle, db2, ...: use FromHeader or FromJSONField).
func (e *DebeziumEvent) Key(recordKey []byte) (string, error) {
	conn, name, coll, err := e.place()
	if err != nil {
		return "", err
	}
	row, err := recordKeyPart(recordKey)
	if err != nil {
		return "", err
	}
	head := DebeziumKeyPrefix + conn + ":" + name + ":" + coll + ":"
	switch e.Op {
	case "r":
		if isNull(e.After) {
			return "", errors.New("debezium: snapshot read without an after image")
		}
		a, err := digest(e.After)
		if err != nil {
			return "", fmt.Errorf("debezium: after image: %w", err)
		}
		if row == "" {
			row = "-"
		}
		return head + "r:snap:" + row + ":a" + a, nil
	case "c", "u", "d", "t", "m":
	default:
		return "", fmt.Errorf("debezium: unknown op %q", e.Op)
	}
	pos, err := e.position(conn)
	if err != nil {
		return "", err
	}
	order := "-"
	if o, ok := e.TotalOrder(); ok {
		order = "o" + o
	}
	switch {
	case e.Op == "t":
		row = "-"
	case e.Op == "m":
		d, err := digest(e.Message)
		if err != nil {
			return "", fmt.Errorf("debezium: message: %w", err)
		}
		row = "m" + d
	case row != "":
	case order != "-":
		row = "-"
	default:
		img, _ := json.Marshal(map[string]json.RawMessage{"before": nullIfEmpty(e.Before), "after": nullIfEmpty(e.After)})
		d, err := digest(img)
		if err != nil {
			return "", fmt.Errorf("debezium: row image: %w", err)
		}
		row = "i" + d
	}
	return head + esc(e.Op) + ":" + pos + ":" + order + ":" + row, nil
}

// recordKeyPart returns "k" + the digest of the record key's payload, or "" for no key.
func recordKeyPart(recordKey []byte) (string, error) {
	k := bytes.TrimSpace(recordKey)
	if len(k) == 0 || string(k) == "null" {
		return "", nil
	}
	if !json.Valid(k) {
		sum := sha256.Sum256(k)
		return "k" + hex.EncodeToString(sum[:16]), nil
	}
	k = unwrapSchema(k)
	if isNull(k) {
		return "", nil
	}
	d, err := digest(k)
	if err != nil {
		return "", err
	}
	return "k" + d, nil
}

// unwrapSchema returns the payload of a JSON converter envelope {"schema": …, "payload": …}
// (exactly those two members, schema an object or null), else raw.
func unwrapSchema(raw []byte) []byte {
	var obj map[string]json.RawMessage
	if json.Unmarshal(raw, &obj) != nil || len(obj) != 2 {
		return raw
	}
	s, okS := obj["schema"]
	p, okP := obj["payload"]
	s = bytes.TrimSpace(s)
	if !okS || !okP || len(s) == 0 || (s[0] != '{' && !isNull(s)) {
		return raw
	}
	return p
}

// digest returns the hex of the first 16 bytes of the SHA-256 of raw's canonical JSON.
func digest(raw []byte) (string, error) {
	c, err := canonicalJSON(raw)
	if err != nil {
		return "", err
	}
	sum := sha256.Sum256(c)
	return hex.EncodeToString(sum[:16]), nil
}

// canonicalJSON re-encodes raw with object members sorted by name, numbers as written and
// no insignificant space.
func canonicalJSON(raw []byte) ([]byte, error) {
	dec := json.NewDecoder(bytes.NewReader(raw))
	dec.UseNumber()
	var v any
	if err := dec.Decode(&v); err != nil {
		return nil, err
	}
	var buf bytes.Buffer
	enc := json.NewEncoder(&buf)
	enc.SetEscapeHTML(false)
	if err := enc.Encode(v); err != nil {
		return nil, err
	}
	return bytes.TrimRight(buf.Bytes(), "\n"), nil
}

func isNull(raw []byte) bool {
	raw = bytes.TrimSpace(raw)
	return len(raw) == 0 || string(raw) == "null"
}

func nullIfEmpty(raw json.RawMessage) json.RawMessage {
	if isNull(raw) {
		return json.RawMessage("null")
	}
	return raw
}

// Position returns the event's key in the first format, the source position alone:
// "pg:<name>:<db>.<schema>.<table>:<op>:<lsn>:<txId>", "mysql:<name>:<db>.<table>:<op>:
// <server_id>:<file>:<pos>:<row>", "sqlserver:<name>:<db>.<schema>.<table>:<op>:<commit_lsn>:
// <change_lsn>:<event_serial_no>"; snapshot events add ":snap:" and a digest of recordKey as
// given (or of the after image without one).
//
// Deprecated: the position alone is not a change's identity: the rows of one PostgreSQL
// COPY share it (all but one would be skipped), incremental snapshot rows have none (an
// error), and a restarted snapshot re-reads rows at a new one. Use Key. Position is kept so
// that code still reading or comparing first-format claims keeps working.
func (e *DebeziumEvent) Position(recordKey []byte) (string, error) {
	conn, name, coll, err := e.place()
	if err != nil {
		return "", err
	}
	var key string
	switch conn {
	case "pg":
		if err := e.need("lsn"); err != nil {
			return "", err
		}
		key = strings.Join([]string{"pg", name, coll, esc(e.Op), e.src("lsn"), e.src("txId")}, ":")
	default:
		pos, err := e.position(conn)
		if err != nil {
			return "", err
		}
		key = strings.Join([]string{conn, name, coll, esc(e.Op), pos}, ":")
	}
	if e.Snapshot() {
		id := recordKey
		if id == nil {
			id = e.After
		}
		sum := sha256.Sum256(id)
		key += ":snap:" + hex.EncodeToString(sum[:16])
	}
	return key, nil
}

var (
	escaper      = strings.NewReplacer("%", "%25", ":", "%3A", ".", "%2E")
	colonEscaper = strings.NewReplacer("%", "%25", ":", "%3A")
)

// esc escapes a name joined with '.' and ':'.
func esc(s string) string { return escaper.Replace(s) }

// FromDebezium returns a KeyFunc that keys a Debezium change event by DebeziumEvent.Key
// (format DebeziumKeyPrefix): the change's source position plus the row's identity for
// streamed changes, the row's identity and content for snapshot reads. A record that is not
// a change (tombstone, heartbeat, transaction metadata, schema change) gives an error
// wrapping ErrNotAChange, which the kafkatx consumer counts and skips; a value that is not a
// Debezium envelope, or lacks its position fields, is another error (the consumer
// dead-letters it). ok is true whenever err is nil.
func FromDebezium() KeyFunc {
	return func(m Message) (string, bool, error) {
		ev, err := ParseDebezium(m.Value)
		if err != nil {
			return "", false, err
		}
		k, err := ev.Key(m.Key)
		if err != nil {
			return "", false, err
		}
		return k, true, nil
	}
}
