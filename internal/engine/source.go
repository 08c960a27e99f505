package engine

import (
	"fmt"

	"github.com/kafkatx/kafkatx/outbox"
)

// ScopesOf returns the Scopes of the messages of a partition of consumer group group at
// replay epoch epoch, read from the log whose topic id (KIP-516) is logID ("" when unknown):
// Claims "group/epoch", Sources "group/epoch/topic id" ("group/epoch" when the topic id is
// unknown). The loop's partition worker and the test kit (kafkatxtest: epoch 0) take theirs
// here, so the kit's business keys and outbox ids are the loop's.
func ScopesOf(group string, epoch int, logID string) Scopes {
	s := fmt.Sprintf("%s/%d", group, epoch)
	if logID == "" {
		return Scopes{Claims: s, Sources: s}
	}
	return Scopes{Claims: s, Sources: s + "/" + logID}
}

// StampSource sets src to the outbox source of the message at topic, partition and offset, in
// scope (Scopes.Sources), with no record written for it yet: the one rule by which the loop
// (kafkatx's conversion of polled records) and the test kit give each message of a try the
// source its outbox records' ids derive from (outbox.SourceID). A try starts with a fresh
// source, so a message run again numbers its records from 0 again.
func StampSource(src *outbox.Source, scope, topic string, partition int32, offset int64) {
	*src = outbox.Source{Scope: scope, Topic: topic, Partition: partition, Offset: offset}
}

// AttachSource gives m, a *kafkatx.Message, its outbox source (kafkatx.Message.OutboxSource):
// package kafkatx sets it when it loads, for the test kit, which builds its messages itself
// and cannot reach the unexported field. Nil until package kafkatx is loaded.
var AttachSource func(m any, src *outbox.Source)
