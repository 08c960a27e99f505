package offsets

import (
	"fmt"
	"github.com/kafkatx/kafkatx/internal/msgfmt"
	"sort"
	"strings"

	"github.com/kafkatx/kafkatx/internal/offsetstate"
	"github.com/kafkatx/kafkatx/internal/offsetstore"
)

// Hints explains, for `kafkatx offsets status`, what starting the consumer will do on the
// drifted partitions of sts of group in schema and quotes the command that does the other
// thing, one hint per state, in state order. quote makes a value one shell word. No drift: no
// hints.
func Hints(schema, group string, sts []PartitionStatus, quote func(string) string) []string {
	byState := map[offsetstate.State][]PartitionStatus{}
	for _, s := range sts {
		if s.Drifted() {
			byState[s.State] = append(byState[s.State], s)
		}
	}
	states := make([]offsetstate.State, 0, len(byState))
	for st := range byState {
		states = append(states, st)
	}
	sort.Slice(states, func(i, j int) bool { return states[i] < states[j] })
	var out []string
	for _, st := range states {
		ps := byState[st]
		first := ps[0]
		where := fmt.Sprintf("%s[%d]", msgfmt.Text(first.Topic), first.Partition)
		if len(ps) > 1 {
			where += fmt.Sprintf(" and %d more", len(ps)-1)
		}
		// A command for the first partition; --to-database and --to-earliest need no
		// per-partition offset, so they cover every partition of a topic at once.
		reset := offsetstate.ResetCommand(schema, group, first.Topic, first.Partition, quote)
		whole := reset
		if len(ps) > 1 {
			where += " (commands for the first; repeat per partition)"
			if oneTopic(ps) {
				whole = offsetstate.ResetCommand(schema, group, first.Topic, -1, quote)
			}
		}
		var w, k int64
		if first.Watermark != nil {
			w = *first.Watermark
		}
		if first.Committed != nil {
			k = *first.Committed
		}
		var h string
		switch st {
		case offsetstate.KafkaAhead:
			if e := first.LastEvent; e != nil && e.Kind == offsetstore.KindOperatorSkip && e.Status == StatusAbandoned && e.From == w && e.To == k {
				h = fmt.Sprintf("kafka_ahead on %s: a half-applied `kafkatx offsets reset --mode skip` (audit row %d, abandoned): it moved Kafka's committed offset to %d, "+
					"then the database refused the watermark's update; not Kafka's own tools. Starting the consumer SKIPS [%d, %d) and records it as unexplained_skip. "+
					"To finish the skip on record, run the same reset again: `%s --to-offset %d --mode skip --reason '...' --execute`; to undo it: `%s --to-database --reason '...' --execute`",
					where, e.ID, k, w, k, reset, k, whole)
				break
			}
			h = fmt.Sprintf("kafka_ahead on %s: Kafka's committed offset was moved past the watermark (Kafka's own tools, or a database restored from an older backup). "+
				"Starting the consumer (OnKafkaAhead's default, follow) SKIPS [%d, %d) FOR GOOD: it follows Kafka and records the range as unexplained_skip in the offset audit (`kafkatx offsets audit --group %s`); "+
				"kafkatx keeps no copy of the skipped messages. To process them instead, before starting it: `%s --to-database --reason '...' --execute` "+
				"(Kafka goes back to the watermark); to skip them on record with a reason: `%s --to-offset %d --mode skip --reason '...' --execute`",
				where, w, k, quote(group), whole, reset, k)
		case offsetstate.DatabaseRolledBack:
			h = fmt.Sprintf("database_rolled_back on %s: Kafka's committed offset %d was committed by kafkatx's consumer on this database, whose watermark is %d: the database lost those transactions (a failover to a standby that lacked them, or a restore). "+
				"Starting the consumer RE-PROCESSES [%d, %d) from the watermark, records it as rollback_replayed in the offset audit and commits the watermark to Kafka; nothing to do. "+
				"To skip the range instead, on record: `%s --to-offset %d --mode skip --reason '...' --execute`",
				where, k, w, w, k, reset, k)
		case offsetstate.KafkaBehind:
			h = fmt.Sprintf("kafka_behind on %s: Kafka's committed offset is behind the watermark (a lost commit, or a rewind with Kafka's own tools). "+
				"Starting the consumer IGNORES the rewind: it starts at the watermark %d and re-commits it; nothing runs again. "+
				"To run [%d, %d) again: `%s --to-offset %d --mode replay --reason '...' --execute`",
				where, w, k, w, reset, k)
		case offsetstate.KafkaMissing:
			h = fmt.Sprintf("kafka_missing on %s: the group has no committed offset (expired or deleted). Starting the consumer re-commits the watermark %d; nothing is skipped or run again. "+
				"To set it now: `%s --to-database --reason '...' --execute`", where, w, whole)
		case offsetstate.WatermarkBelowLogStart:
			h = fmt.Sprintf("watermark_below_log_start on %s: retention removed [%d, %d) before it was processed; those messages are gone from Kafka. "+
				"Starting the consumer records the range as unexplained_skip in the offset audit and goes on from the log start",
				where, w, first.LogStart)
		case offsetstate.WatermarkPastLogEnd:
			h = fmt.Sprintf("watermark_past_log_end on %s: the log now ends at %d, below the watermark %d: records [%d, %d) that kafkatx processed are no longer in it — "+
				"the same topic (a recreated one shows as log_changed), so its log was truncated, most likely by an unclean leader election, and records written since may take those offsets again; "+
				"the consumer refuses to start on it. To process the topic's records from its start: `%s --to-earliest --mode replay --reason '...' --execute`; to skip to its end: `%s --to-latest --mode skip --reason '...' --execute`",
				where, first.LogEnd, w, first.LogEnd, w, whole, whole)
		case offsetstate.LogChanged:
			h = fmt.Sprintf("log_changed on %s: the log behind the watermark is another one: %s. The watermark %d counts offsets of the old log and means nothing in this one; "+
				"the consumer refuses to start on it (unless Config.OnLogChange adopts it) and applies nothing from the new log. "+
				"To process the new log from its start: `%s --mode adopt --to-earliest --reason '...' --execute` (or --to-latest to skip what it holds now, --to-time T from a time)",
				where, first.Log.Change().What(), w, whole)
		case offsetstate.KafkaPastLogEnd:
			h = fmt.Sprintf("kafka_past_log_end on %s: Kafka's committed offset %d is past the log end; the consumer ignores it and starts at the watermark %d. "+
				"To align Kafka now: `%s --to-database --reason '...' --execute`", where, k, w, whole)
		default:
			continue
		}
		out = append(out, h)
	}
	return out
}

// oneTopic reports whether ps are all of one topic.
func oneTopic(ps []PartitionStatus) bool {
	for _, p := range ps[1:] {
		if p.Topic != ps[0].Topic {
			return false
		}
	}
	return true
}

// UndoHint says, for an offset audit row that skipped a range, how to undo it: a replay of
// [From, To), possible only while Kafka still holds those records, since kafkatx keeps no copy
// of skipped messages. Other kinds have none (""). schema holds the audit row.
func UndoHint(schema string, e offsetstore.Event, quote func(string) string) string {
	switch e.Kind {
	case offsetstore.KindUnexplainedSkip, offsetstore.KindOperatorSkip:
	default:
		return ""
	}
	if e.To <= e.From {
		return ""
	}
	return strings.Join([]string{
		fmt.Sprintf("undo: stop the group's consumers, then `%s --to-offset %d --mode replay --reason '...' --execute`",
			offsetstate.ResetCommand(schema, e.Group, e.Topic, e.Partition, quote), e.From),
		fmt.Sprintf("(runs [%d, %d) again and everything after it that was processed since; kafkatx kept no copy of the skipped messages: only while Kafka's log start is <= %d)", e.From, e.To, e.From),
	}, " ")
}
