package outbox

import (
	"context"
	"crypto/sha1"
	"strconv"
	"sync/atomic"

	"github.com/google/uuid"
)

// Source is the input message a record is written for inside kafkatx's consumer loop: the
// scope of the message's group, its partition's replay epoch and the topic id of the log it
// came from ("group/epoch/topic id": business idempotency keys are scoped "group/epoch"; the
// topic id gives a recreated topic's messages at reused offsets ids of their own), and the
// message's topic, partition and offset.
// The loop gives one to every message it hands a handler (kafkatx.Message.OutboxSource, and in
// the context of a per-message kafkatx.Handler's call); a record written for a Source —
// Record.Source, or WriteTx's ctx carrying one (WithSource) — gets an outbox id derived from
// it and from the record's position among the records written for that message in this try
// (SourceID), instead of a random one. So a message re-processed after its effects were lost
// (a database failover or restore: the same epoch) publishes its events under the same
// kafkatx-outbox-id, and a consumer deduplicating by that id sees each event once; an
// operator's `kafkatx offsets reset --mode replay` raises the epoch, so the replay's events
// get new ids. Records without a Source (written outside the loop, by plain SQL, by other
// languages) keep random ids (docs/outbox-table.md, "Event identity").
type Source struct {
	Scope     string // "group/epoch/topic id" (the loop's; "group/epoch" when the topic id is unknown)
	Topic     string
	Partition int32
	Offset    int64

	written atomic.Uint32 // records written for the message so far in this try
}

type sourceKey struct{}

// WithSource returns ctx carrying s: WriteTx derives the ids of records without their own
// Source from it. A nil s returns ctx.
func WithSource(ctx context.Context, s *Source) context.Context {
	if s == nil {
		return ctx
	}
	return context.WithValue(ctx, sourceKey{}, s)
}

// SourceFrom returns the Source ctx carries, or nil.
func SourceFrom(ctx context.Context) *Source {
	s, _ := ctx.Value(sourceKey{}).(*Source)
	return s
}

// sourceNamespace is the name-based UUID namespace of derived outbox ids.
var sourceNamespace = uuid.NewSHA1(uuid.NameSpaceURL, []byte("https://github.com/kafkatx/kafkatx/outbox/source"))

// SourceID is the outbox id of the record at 0-based position pos among those written for
// the message s names: a version-5 (SHA-1, name-based) UUID of scope, topic, partition,
// offset and pos, NUL-separated. Random ids are version 4 and the WAL relay's own version 8,
// so a derived id never equals either.
func SourceID(s *Source, pos uint32) uuid.UUID {
	// uuid.NewSHA1(sourceNamespace, name), without its allocations (a hash object, its sum
	// and the name): the hash of namespace and name, in a buffer on the stack when it fits.
	var buf [256]byte
	b := append(buf[:0], sourceNamespace[:]...)
	b = append(append(b, s.Scope...), 0)
	b = append(append(b, s.Topic...), 0)
	b = append(strconv.AppendInt(b, int64(s.Partition), 10), 0)
	b = append(strconv.AppendInt(b, s.Offset, 10), 0)
	b = strconv.AppendUint(b, uint64(pos), 10)
	sum := sha1.Sum(b)
	var id uuid.UUID
	copy(id[:], sum[:16])
	id[6] = (id[6] & 0x0f) | 0x50 // version 5
	id[8] = (id[8] & 0x3f) | 0x80 // RFC 4122 variant
	return id
}

// next takes the id of the next record written for s.
func (s *Source) next() uuid.UUID { return SourceID(s, s.written.Add(1)-1) }

// HeaderSourceID carries a record's derived outbox id (SourceID, text form) from WriteTx to
// the WAL relay in WAL mode, whose records have no outbox_id column: the relay publishes it
// as HeaderOutboxID instead of the id it derives from the commit LSN, and drops the header.
// Only WriteTx sets it.
const HeaderSourceID = "kafkatx-outbox-source-id"

// sourceIDs returns the derived id of each record (uuid.Nil for one without a Source), and
// whether any has one.
func sourceIDs(ctx context.Context, records []Record) ([]uuid.UUID, bool) {
	fromCtx := SourceFrom(ctx)
	var ids []uuid.UUID
	for i := range records {
		s := records[i].Source
		if s == nil {
			s = fromCtx
		}
		if s == nil {
			continue
		}
		if ids == nil {
			ids = make([]uuid.UUID, len(records))
		}
		ids[i] = s.next()
	}
	return ids, ids != nil
}

// withSourceHeaders returns a copy of records in which each record with a derived id carries
// it in a HeaderSourceID header (WAL mode), the caller's header slices left untouched.
func withSourceHeaders(records []Record, ids []uuid.UUID) []Record {
	out := make([]Record, len(records))
	for i, r := range records {
		out[i] = r
		if ids[i] == uuid.Nil {
			continue
		}
		hs := make([]Header, 0, len(r.Headers)+1)
		for _, h := range r.Headers {
			if h.Key != HeaderSourceID {
				hs = append(hs, h)
			}
		}
		out[i].Headers = append(hs, Header{Key: HeaderSourceID, Value: []byte(ids[i].String())})
	}
	return out
}
