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

// DebeziumEvent is a decoded Debezium change event value (the envelope with before, after,
// source, op and ts_ms), with or without the JSON converter's {"schema", "payload"} wrapper.
// Before and After are the row images as raw JSON (JSON null when absent).
type DebeziumEvent struct {
	Op     string                     `json:"op"`
	Before json.RawMessage            `json:"before"`
	After  json.RawMessage            `json:"after"`
	Source map[string]json.RawMessage `json:"source"`
	TsMs   json.Number                `json:"ts_ms"`
}

// ParseDebezium decodes a Debezium change event value produced by the JSON converter, with
// schemas enabled ({"schema": ..., "payload": {envelope}}) or not ({envelope}). It fails on a
// value that is not a JSON object or has no source block; a tombstone (empty value) is an
// error too, check for it first.
func ParseDebezium(value []byte) (*DebeziumEvent, error) {
	var outer map[string]json.RawMessage
	if err := json.Unmarshal(value, &outer); err != nil {
		return nil, errors.New("debezium: value is not a JSON object")
	}
	body := value
	if p, ok := outer["payload"]; ok && outer["source"] == nil {
		if bytes.Equal(bytes.TrimSpace(p), []byte("null")) {
			return nil, errors.New("debezium: payload is null")
		}
		body = p
	}
	dec := json.NewDecoder(bytes.NewReader(body))
	dec.UseNumber()
	var ev DebeziumEvent
	if err := dec.Decode(&ev); err != nil {
		return nil, fmt.Errorf("debezium: decode envelope: %w", err)
	}
	if ev.Source == nil {
		return nil, errors.New("debezium: envelope has no source block")
	}
	return &ev, nil
}

// Snapshot reports whether the event was read by a snapshot (op "r", or source.snapshot set
// to anything but false): all rows of one snapshot share one source position.
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

// Position returns the event's source position as an idempotency key: the same change
// re-published (at another offset, by a connector restarted from an older offset, by a
// mirror) has the same key, and two different changes never do. The key names the connector,
// the logical server name, the table and the operation, then the connector's position:
//
//   - postgresql: source.lsn and source.txId, as
//     "pg:<name>:<db>.<schema>.<table>:<op>:<lsn>:<txId>". The table and op are part of the
//     key because one WAL record can yield several events (a TRUNCATE of several tables; a
//     primary-key update, emitted as a delete and a create).
//   - mysql: source.server_id, source.file, source.pos and source.row (the row within the
//     binlog event), as "mysql:<name>:<db>.<table>:<op>:<server_id>:<file>:<pos>:<row>".
//   - sqlserver: source.commit_lsn, source.change_lsn and source.event_serial_no, as
//     "sqlserver:<name>:<db>.<schema>.<table>:<op>:<commit_lsn>:<change_lsn>:<event_serial_no>".
//
// Snapshot events (see Snapshot) share one position per snapshot, so their key adds
// ":snap:" and the first 16 bytes, in hex, of the SHA-256 of recordKey (the row's primary
// key as Debezium wrote it), or of the after image when recordKey is nil. Name, database,
// schema and table are percent-escaped so that ':', '.' and '%' inside them cannot make two
// keys equal (the binlog file name: ':' and '%'). Other connectors (mongodb, oracle, db2, ...) are an error: use FromHeader or
// FromJSONField with a field that identifies the change.
func (e *DebeziumEvent) Position(recordKey []byte) (string, error) {
	f := func(name string) string {
		s, _, _ := jsonScalar(e.Source[name])
		return s
	}
	need := func(names ...string) error {
		for _, n := range names {
			if s, ok, err := jsonScalar(e.Source[n]); err != nil || !ok || s == "" {
				return fmt.Errorf("debezium: source.%s is missing or not a string or number", n)
			}
		}
		return nil
	}
	name, db, schema, table := esc(f("name")), esc(f("db")), esc(f("schema")), esc(f("table"))
	op := esc(e.Op)
	var key string
	switch c := e.Connector(); c {
	case "postgresql":
		if err := need("lsn"); err != nil {
			return "", err
		}
		key = strings.Join([]string{"pg", name, db + "." + schema + "." + table, op, f("lsn"), f("txId")}, ":")
	case "mysql":
		if err := need("file", "pos"); err != nil {
			return "", err
		}
		row := f("row")
		if row == "" {
			row = "0"
		}
		key = strings.Join([]string{"mysql", name, db + "." + table, op, f("server_id"), colonEscaper.Replace(f("file")), f("pos"), row}, ":")
	case "sqlserver":
		if err := need("change_lsn"); err != nil {
			return "", err
		}
		key = strings.Join([]string{"sqlserver", name, db + "." + schema + "." + table, op, f("commit_lsn"), f("change_lsn"), f("event_serial_no")}, ":")
	case "":
		return "", errors.New("debezium: source has no connector and no known position fields")
	default:
		return "", fmt.Errorf("debezium: connector %q is not supported for source-position keys; use FromHeader or FromJSONField", c)
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

// FromDebezium returns a KeyFunc that takes the key from a Debezium change event's source
// position (see DebeziumEvent.Position for the connectors and fields). A tombstone (empty
// value) gives ok == false; a value that is not a Debezium envelope, or lacks its position
// fields, is an error.
func FromDebezium() KeyFunc {
	return func(m Message) (string, bool, error) {
		if len(bytes.TrimSpace(m.Value)) == 0 {
			return "", false, nil
		}
		ev, err := ParseDebezium(m.Value)
		if err != nil {
			return "", false, err
		}
		k, err := ev.Position(m.Key)
		if err != nil {
			return "", false, err
		}
		return k, true, nil
	}
}
