// Package outboxpack encodes and decodes the records of a packed outbox row (the pack column of
// <schema>.outbox, migration 015; docs/outbox-table.md#packed-rows): the writer (package
// outbox) encodes, the table relay (outbox/relay) and the test kit (kafkatxtest) decode.
//
// Format, version 1: the byte 0x01, the record count (uvarint), then each record in write
// order: its outbox_id (16 bytes), its topic (uvarint length, bytes), its key and its value
// (uvarint length+1, bytes; 0 is NULL), its partition (uvarint partition+1; 0 is none), its
// header count (uvarint) and each header's key and value (uvarint length, bytes).
package outboxpack

import (
	"encoding/binary"
	"errors"
	"fmt"
)

// Version is the format's first byte.
const Version = 1

// Record is one record of a pack.
type Record struct {
	OutboxID  [16]byte
	Topic     string
	Key       []byte // nil: NULL
	Value     []byte // nil: NULL
	Partition *int32
	HK, HV    [][]byte // header keys and values, same length
}

// Size is the encoded size of r, for sizing a pack before it is encoded.
func Size(topic string, key, value []byte, hk, hv [][]byte) int {
	n := 16 + 2*binary.MaxVarintLen32 + len(topic) + len(key) + len(value) + 2*binary.MaxVarintLen32
	for i := range hk {
		n += 2*binary.MaxVarintLen32 + len(hk[i]) + len(hv[i])
	}
	return n
}

// Encoder appends records to a pack.
type Encoder struct {
	buf []byte
	n   int
}

// NewEncoder starts a pack of about size bytes (a hint).
func NewEncoder(size int) *Encoder {
	return &Encoder{buf: make([]byte, 0, size+16)}
}

// Add appends one record.
func (e *Encoder) Add(id [16]byte, topic string, key, value []byte, partition *int32, hk, hv [][]byte) {
	b := e.buf
	b = append(b, id[:]...)
	b = binary.AppendUvarint(b, uint64(len(topic)))
	b = append(b, topic...)
	b = appendNullable(b, key)
	b = appendNullable(b, value)
	if partition == nil {
		b = append(b, 0)
	} else {
		b = binary.AppendUvarint(b, uint64(*partition)+1)
	}
	b = binary.AppendUvarint(b, uint64(len(hk)))
	for i := range hk {
		b = binary.AppendUvarint(b, uint64(len(hk[i])))
		b = append(b, hk[i]...)
		b = binary.AppendUvarint(b, uint64(len(hv[i])))
		b = append(b, hv[i]...)
	}
	e.buf = b
	e.n++
}

// Len is the number of records added.
func (e *Encoder) Len() int { return e.n }

// Bytes returns the pack: the version, the count and the records.
func (e *Encoder) Bytes() []byte {
	head := binary.AppendUvarint([]byte{Version}, uint64(e.n))
	return append(head, e.buf...)
}

func appendNullable(b, v []byte) []byte {
	if v == nil {
		return append(b, 0)
	}
	b = binary.AppendUvarint(b, uint64(len(v))+1)
	return append(b, v...)
}

var errShort = errors.New("pack: truncated")

// Decode returns the records of pack p. Keys, values and headers alias p. It returns an
// error for another version, a truncated pack or trailing bytes.
func Decode(p []byte) ([]Record, error) {
	if len(p) == 0 || p[0] != Version {
		if len(p) == 0 {
			return nil, errors.New("pack: empty")
		}
		return nil, fmt.Errorf("pack: version %d; this relay reads version %d (upgrade it)", p[0], Version)
	}
	d := decoder{b: p[1:]}
	n := d.uvarint()
	if d.err != nil || n > uint64(len(p)) {
		return nil, fmt.Errorf("pack: bad record count")
	}
	out := make([]Record, n)
	for i := range out {
		r := &out[i]
		copy(r.OutboxID[:], d.take(16))
		if t := d.take(int(d.uvarint())); i > 0 && string(t) == out[i-1].Topic {
			r.Topic = out[i-1].Topic // a pack's records mostly share a topic: one string
		} else {
			r.Topic = string(t)
		}
		r.Key = d.nullable()
		r.Value = d.nullable()
		if pt := d.uvarint(); pt > 0 {
			v := int32(pt - 1)
			r.Partition = &v
		}
		nh := d.uvarint()
		if d.err != nil || nh > uint64(len(d.b)) {
			return nil, fmt.Errorf("pack: record %d: bad header count", i)
		}
		if nh > 0 {
			r.HK, r.HV = make([][]byte, nh), make([][]byte, nh)
			for j := range r.HK {
				r.HK[j] = d.take(int(d.uvarint()))
				r.HV[j] = d.take(int(d.uvarint()))
				if r.HV[j] == nil {
					r.HV[j] = []byte{}
				}
			}
		}
		if d.err != nil {
			return nil, fmt.Errorf("pack: record %d of %d: %w", i, n, d.err)
		}
	}
	if len(d.b) != 0 {
		return nil, fmt.Errorf("pack: %d bytes after the last record", len(d.b))
	}
	return out, nil
}

type decoder struct {
	b   []byte
	err error
}

func (d *decoder) uvarint() uint64 {
	if d.err != nil {
		return 0
	}
	v, n := binary.Uvarint(d.b)
	if n <= 0 {
		d.err = errShort
		return 0
	}
	d.b = d.b[n:]
	return v
}

func (d *decoder) take(n int) []byte {
	if d.err != nil {
		return nil
	}
	if n < 0 || n > len(d.b) {
		d.err = errShort
		return nil
	}
	v := d.b[:n:n]
	d.b = d.b[n:]
	return v
}

func (d *decoder) nullable() []byte {
	l := d.uvarint()
	if l == 0 || d.err != nil {
		return nil
	}
	v := d.take(int(l - 1))
	if v == nil && d.err == nil {
		v = []byte{}
	}
	return v
}
