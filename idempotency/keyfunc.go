package idempotency

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"strings"

	"github.com/kafkatx/kafkatx/outbox"
)

// Message is the part of a Kafka record that a KeyFunc reads. The root kafkatx package
// builds one from its own Message (this package does not import it):
//
//	idempotency.Message{Topic: m.Topic, Partition: m.Partition, Offset: m.Offset,
//		Key: m.Key, Value: m.Value, Header: m.Header}
type Message struct {
	Topic     string
	Partition int32
	Offset    int64
	// Key is the record key (nil for a record without one).
	Key []byte
	// Value is the record value (nil for a tombstone).
	Value []byte
	// Header returns the value of the last header named name and whether there was one.
	// Nil means the record has no headers.
	Header func(name string) ([]byte, bool)
}

func (m Message) header(name string) ([]byte, bool) {
	if m.Header == nil {
		return nil, false
	}
	return m.Header(name)
}

// KeyFunc derives a message's business idempotency key. ok == false means the message has no
// such key (a missing header, a tombstone): the consumer then relies on the message's Kafka
// position alone. A non-nil error means the message is malformed for this function (a value
// that is not JSON, a Debezium envelope without a source position); a consumer should treat
// it as permanent, since retrying cannot change the bytes.
type KeyFunc func(m Message) (key string, ok bool, err error)

// FromHeader returns a KeyFunc that takes the key from the last header named name (for
// example "idempotency-key"), byte for byte. A missing or empty header gives ok == false.
func FromHeader(name string) KeyFunc {
	return func(m Message) (string, bool, error) {
		v, ok := m.header(name)
		if !ok || len(v) == 0 {
			return "", false, nil
		}
		return string(v), true, nil
	}
}

// FromOutboxID returns a KeyFunc that takes the key from the kafkatx-outbox-id header set by
// kafkatx's relay, as "outbox:<id>". A record published by a relay crash twice (at two
// offsets) carries the same id, so its second copy is skipped. A missing header gives
// ok == false.
func FromOutboxID() KeyFunc {
	h := FromHeader(outbox.HeaderOutboxID)
	return func(m Message) (string, bool, error) {
		id, ok, err := h(m)
		if !ok || err != nil {
			return "", ok, err
		}
		return "outbox:" + id, true, nil
	}
}

// FromJSONField returns a KeyFunc that takes the key from a field of the JSON object in the
// record value; path names nested fields ("payload", "order_id"). A string field is used as
// is; a number keeps its JSON text (1e3 and 1000 are different keys); a missing field, JSON
// null or an empty string gives ok == false; an empty value (a tombstone) gives ok == false;
// a value that is not a JSON object, or a field that is an object, array or boolean, is an
// error.
func FromJSONField(path ...string) KeyFunc {
	return func(m Message) (string, bool, error) {
		if len(path) == 0 {
			return "", false, errors.New("idempotency: FromJSONField needs a field name")
		}
		if len(bytes.TrimSpace(m.Value)) == 0 {
			return "", false, nil
		}
		raw := json.RawMessage(m.Value)
		for i, name := range path {
			var obj map[string]json.RawMessage
			if err := json.Unmarshal(raw, &obj); err != nil {
				return "", false, fmt.Errorf("idempotency: key field %s: value is not a JSON object", strings.Join(path[:i], "."))
			}
			v, ok := obj[name]
			if !ok {
				return "", false, nil
			}
			raw = v
		}
		s, ok, err := jsonScalar(raw)
		if err != nil {
			return "", false, fmt.Errorf("idempotency: key field %s: %w", strings.Join(path, "."), err)
		}
		return s, ok && s != "", nil
	}
}

// jsonScalar returns a JSON string's content or a number's text; null gives ok == false.
func jsonScalar(raw json.RawMessage) (string, bool, error) {
	raw = bytes.TrimSpace(raw)
	if len(raw) == 0 || string(raw) == "null" {
		return "", false, nil
	}
	switch raw[0] {
	case '"':
		var s string
		if err := json.Unmarshal(raw, &s); err != nil {
			return "", false, err
		}
		return s, true, nil
	case '-', '0', '1', '2', '3', '4', '5', '6', '7', '8', '9':
		var n json.Number
		if err := json.Unmarshal(raw, &n); err != nil {
			return "", false, err
		}
		return n.String(), true, nil
	default:
		return "", false, fmt.Errorf("want a string or a number, got %.20s", raw)
	}
}

// FirstOf returns a KeyFunc that tries fns in order and returns the first key found (the
// first ok == true) or the first error. Keys from different functions share one namespace:
// combine functions whose keys cannot collide (FromOutboxID's and FromDebezium's keys carry
// a prefix; FromHeader's and FromJSONField's do not).
func FirstOf(fns ...KeyFunc) KeyFunc {
	return func(m Message) (string, bool, error) {
		for _, f := range fns {
			k, ok, err := f(m)
			if err != nil || ok {
				return k, ok, err
			}
		}
		return "", false, nil
	}
}
