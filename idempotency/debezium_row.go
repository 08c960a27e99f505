package idempotency

import (
	"bytes"
	"encoding/base64"
	"encoding/hex"
	"encoding/json"
	"errors"
	"sort"
)

// UnavailableValue is the Debezium PostgreSQL connector's default
// unavailable.value.placeholder: the value it sends for a TOASTed column that an update left
// unchanged (PostgreSQL does not write such a value to the WAL, so the connector never sees
// it). It is not the column's value.
const UnavailableValue = "__debezium_unavailable_value"

var unavailableForms = map[string]bool{
	UnavailableValue: true,
	// binary columns: binary.handling.mode=bytes (base64 in JSON), hex, base64-url-safe
	base64.StdEncoding.EncodeToString([]byte(UnavailableValue)): true,
	hex.EncodeToString([]byte(UnavailableValue)):                true,
	base64.URLEncoding.EncodeToString([]byte(UnavailableValue)): true,
}

// isUnavailable reports whether a column value is the placeholder: the string (or its
// base64/hex form for binary columns), or an array holding only it (array columns).
func isUnavailable(raw json.RawMessage) bool {
	raw = bytes.TrimSpace(raw)
	if len(raw) == 0 {
		return false
	}
	switch raw[0] {
	case '"':
		var s string
		return json.Unmarshal(raw, &s) == nil && unavailableForms[s]
	case '[':
		var a []json.RawMessage
		if json.Unmarshal(raw, &a) != nil || len(a) != 1 {
			return false
		}
		return isUnavailable(a[0])
	}
	return false
}

// WithoutUnavailable returns the row image row (a JSON object, as in an event's after)
// without the columns that carry UnavailableValue, and those columns' names, sorted. A
// column missing from the result was not sent by the connector: its value is unknown here
// (unchanged by this update; read it from the source if it is needed). A row without
// placeholders is returned as it is. Errors: row is not a JSON object.
func WithoutUnavailable(row json.RawMessage) (json.RawMessage, []string, error) {
	if !bytes.Contains(row, []byte(`"`)) {
		var probe map[string]json.RawMessage
		if err := json.Unmarshal(row, &probe); err != nil || probe == nil {
			return nil, nil, errors.New("debezium: row image is not a JSON object")
		}
		return row, nil, nil
	}
	var cols map[string]json.RawMessage
	if err := json.Unmarshal(row, &cols); err != nil || cols == nil {
		return nil, nil, errors.New("debezium: row image is not a JSON object")
	}
	var gone []string
	for name, v := range cols {
		if isUnavailable(v) {
			gone = append(gone, name)
		}
	}
	if len(gone) == 0 {
		return row, nil, nil
	}
	sort.Strings(gone)
	for _, name := range gone {
		delete(cols, name)
	}
	out, err := json.Marshal(cols)
	if err != nil {
		return nil, nil, err
	}
	return out, gone, nil
}

// KeyColumns returns the row image row restricted to the columns named in the record key
// (unwrapped from the JSON converter's {"schema", "payload"}): for a delete under PostgreSQL's
// default replica identity the before image holds real values only for those columns, and
// type defaults or nulls ("", 0, null) for the others. ok is false when the record has no
// JSON object key (a keyless table), in which case row is returned as it is.
func KeyColumns(row json.RawMessage, recordKey []byte) (out json.RawMessage, ok bool, err error) {
	k := bytes.TrimSpace(recordKey)
	if len(k) == 0 || !json.Valid(k) {
		return row, false, nil
	}
	var key map[string]json.RawMessage
	if json.Unmarshal(unwrapSchema(k), &key) != nil || len(key) == 0 {
		return row, false, nil
	}
	var cols map[string]json.RawMessage
	if err := json.Unmarshal(row, &cols); err != nil || cols == nil {
		return nil, false, errors.New("debezium: row image is not a JSON object")
	}
	keep := make(map[string]json.RawMessage, len(key))
	for name, v := range key {
		if c, found := cols[name]; found {
			keep[name] = c
		} else {
			keep[name] = v
		}
	}
	out, err = json.Marshal(keep)
	return out, err == nil, err
}
