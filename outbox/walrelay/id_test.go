package walrelay

import (
	"testing"

	"github.com/google/uuid"
	"github.com/jackc/pglogrepl"
)

// The headers' reused buffers hold what uuid.UUID.String and pglogrepl.LSN.String would, and
// the outbox id is a version-8, RFC 9562 variant UUID that changes with each of its inputs.
func TestHeaderEncodingsAndOutboxID(t *testing.T) {
	for _, at := range []position{{0, 0}, {0x16B3748, 7}, {0xABCDEF0123456789, 4294967295}} {
		u := outboxID(sourceHash("7123", "db", "kafkatx"), at.commit, at.pos)
		if got := string(appendUUID(nil, u)); got != u.String() {
			t.Fatalf("appendUUID %s, want %s", got, u)
		}
		if got, want := string(appendPosition(nil, at)), at.commit.String()+"#"+uitoa(at.pos); got != want {
			t.Fatalf("appendPosition %s, want %s", got, want)
		}
		if u.Version() != 8 || u.Variant() != uuid.RFC4122 {
			t.Fatalf("%s: version %d variant %v", u, u.Version(), u.Variant())
		}
	}
	base := outboxID(1, 100, 1)
	for _, other := range []uuid.UUID{outboxID(2, 100, 1), outboxID(1, 101, 1), outboxID(1, 100, 2), outboxID(1, pglogrepl.LSN(100+1<<40), 1)} {
		if other == base {
			t.Fatalf("two identities share outbox id %s", base)
		}
	}
}

func uitoa(v uint32) string {
	if v == 0 {
		return "0"
	}
	var b []byte
	for ; v > 0; v /= 10 {
		b = append([]byte{byte('0' + v%10)}, b...)
	}
	return string(b)
}
