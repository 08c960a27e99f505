package walrelay

import (
	"encoding/binary"
	"hash/fnv"

	"github.com/google/uuid"
	"github.com/jackc/pglogrepl"

	"github.com/kafkatx/kafkatx/outbox"
)

// HeaderPosition names a published record's source position: "<commit LSN>#<position>", the
// commit LSN of the transaction that wrote it (PostgreSQL's X/X text form) and the record's
// 0-based position among that transaction's outbox messages. It is the record's identity;
// the message's own LSN is not (dbz#2004).
const HeaderPosition = "kafkatx-outbox-wal-position"

// sourceHash names the source of a slot's records: 26 bits of FNV-1a over the cluster's
// system identifier, the database and the schema, so two databases' records never share an
// outbox id.
func sourceHash(systemID, database, schema string) uint32 {
	h := fnv.New32a()
	h.Write([]byte(systemID + "\x00" + database + "\x00" + schema))
	return h.Sum32() & (1<<26 - 1)
}

// recordID is the kafkatx-outbox-id of record rec at position at (src: the source bits with the
// commit's timeline, timelineSource): the id outbox.WriteTx derived
// from the record's input message (outbox.Source) when it carries one in an
// outbox.HeaderSourceID header — the same for every processing of that message, on any
// timeline — else outboxID's.
func recordID(src uint32, at position, rec *outbox.Record) uuid.UUID {
	for i := len(rec.Headers) - 1; i >= 0; i-- {
		if rec.Headers[i].Key == outbox.HeaderSourceID {
			if id, err := uuid.ParseBytes(rec.Headers[i].Value); err == nil {
				return id
			}
			break
		}
	}
	return outboxID(src, at.commit, at.pos)
}

// outboxID is the kafkatx-outbox-id of the record at position pos of the transaction that
// committed at commit: a version-8 UUID holding the commit LSN (64 bits), the position
// (32 bits) and the source hash (26 bits). The same record always gets the same id, so a
// consumer deduplicating by it drops a copy whatever published it.
func outboxID(src uint32, commit pglogrepl.LSN, pos uint32) uuid.UUID {
	var u uuid.UUID
	lsn := uint64(commit)
	binary.BigEndian.PutUint32(u[0:4], uint32(lsn>>32))
	binary.BigEndian.PutUint16(u[4:6], uint16(lsn>>16))
	u[6] = 0x80 | byte(src>>22&0x0f) // version 8
	u[7] = byte(src >> 14)
	u[8] = 0x80 | byte(src>>8&0x3f) // variant 10
	u[9] = byte(src)
	binary.BigEndian.PutUint16(u[10:12], uint16(lsn))
	binary.BigEndian.PutUint32(u[12:16], pos)
	return u
}
