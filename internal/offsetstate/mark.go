package offsetstate

import (
	"fmt"
	"strconv"
	"strings"
)

// Database names the PostgreSQL database a watermark lives in, as far as a database rollback
// is concerned: the cluster's system identifier (pg_control_system(); a standby made with
// pg_basebackup, promoted or not, and a cluster restored from a physical backup keep it), the
// database's OID (a pg_dump restored elsewhere gets another) and the server's current
// timeline (a promotion or a point-in-time recovery starts a new one).
type Database struct {
	System   string // system identifier, decimal
	OID      uint32 // pg_database.oid of the current database
	Timeline uint32 // the timeline of the server's WAL insert position
}

// Same reports whether d and o are the same database, on any timeline: the same system
// identifier and database OID. The zero Database is the same as nothing.
func (d Database) Same(o Database) bool {
	return d.System != "" && d.System == o.System && d.OID == o.OID
}

// CommitMark is the metadata kafkatx's consumer writes with every offset commit it makes
// (Kafka's OffsetCommit carries a metadata string per partition; confluent-kafka-go's
// TopicPartition.Metadata). Kafka's own tools write none (kafka-consumer-groups
// --reset-offsets, AlterConsumerGroupOffsets without metadata), nor does `kafkatx offsets
// reset`; so a committed offset ahead of the watermark that carries a mark naming the same
// Database was committed by the consumer after a database commit that the database no longer
// has: a rollback of the database (docs/offsets.md, "Database rollbacks").
type CommitMark struct {
	Database
	Epoch int // the partition's replay epoch when the offset was committed
}

// markPrefix versions the mark's text form.
const markPrefix = "kafkatx/1 "

// String is the mark's text form, "kafkatx/1 s=<system id> d=<oid> t=<timeline> e=<epoch>"
// (at most 71 bytes; Kafka's offset.metadata.max.bytes defaults to 4096).
func (m CommitMark) String() string {
	return fmt.Sprintf("%ss=%s d=%d t=%d e=%d", markPrefix, m.System, m.OID, m.Timeline, m.Epoch)
}

// ParseCommitMark reads a committed offset's metadata; ok is false for anything String did
// not write (empty metadata, another tool's, another version).
func ParseCommitMark(s string) (m CommitMark, ok bool) {
	rest, found := strings.CutPrefix(s, markPrefix)
	if !found {
		return CommitMark{}, false
	}
	fields := strings.Fields(rest)
	if len(fields) != 4 {
		return CommitMark{}, false
	}
	var seen int
	for i, f := range fields {
		k, v, found := strings.Cut(f, "=")
		if !found || k != "sdte"[i:i+1] {
			return CommitMark{}, false
		}
		n, err := strconv.ParseUint(v, 10, 64)
		if err != nil {
			return CommitMark{}, false
		}
		switch k {
		case "s":
			m.System = v
		case "d":
			if n > 1<<32-1 {
				return CommitMark{}, false
			}
			m.OID = uint32(n)
		case "t":
			if n > 1<<32-1 {
				return CommitMark{}, false
			}
			m.Timeline = uint32(n)
		case "e":
			if n > 1<<31-1 {
				return CommitMark{}, false
			}
			m.Epoch = int(n)
		}
		seen++
	}
	return m, seen == 4
}
