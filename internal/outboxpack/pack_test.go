package outboxpack

import (
	"bytes"
	"testing"
)

func TestRoundTrip(t *testing.T) {
	p := int32(3)
	e := NewEncoder(0)
	e.Add([16]byte{1}, "a", nil, []byte("v"), nil, nil, nil)
	e.Add([16]byte{2}, "topic-b", []byte{}, nil, &p, [][]byte{[]byte("h")}, [][]byte{{}})
	e.Add([16]byte{3}, "c", []byte("k"), []byte{}, nil, [][]byte{[]byte("x"), []byte("y")}, [][]byte{[]byte("1"), []byte("2")})
	got, err := Decode(e.Bytes())
	if err != nil {
		t.Fatal(err)
	}
	if len(got) != 3 {
		t.Fatalf("%d records", len(got))
	}
	if got[0].OutboxID != [16]byte{1} || got[0].Topic != "a" || got[0].Key != nil || string(got[0].Value) != "v" || got[0].Partition != nil {
		t.Errorf("record 0: %+v", got[0])
	}
	if got[1].Key == nil || len(got[1].Key) != 0 || got[1].Value != nil || got[1].Partition == nil || *got[1].Partition != 3 ||
		len(got[1].HK) != 1 || got[1].HV[0] == nil {
		t.Errorf("record 1: %+v", got[1])
	}
	if string(got[2].Key) != "k" || got[2].Value == nil || len(got[2].Value) != 0 || !bytes.Equal(got[2].HV[1], []byte("2")) {
		t.Errorf("record 2: %+v", got[2])
	}
	b := e.Bytes()
	for _, bad := range [][]byte{nil, {2, 0}, b[:len(b)-1], append(append([]byte(nil), b...), 0)} {
		if _, err := Decode(bad); err == nil {
			t.Errorf("Decode(%x) gave no error", bad)
		}
	}
}
