package offsetstate

import (
	"fmt"

	"github.com/kafkatx/kafkatx/internal/msgfmt"
)

// LogChanged: the log behind the watermark is not the one it was recorded in — the topic's id
// (KIP-516) or the cluster's id differs from the one recorded with the watermark (the topic
// was deleted and recreated under the same name, or the name now points at another cluster).
// The watermark's offsets mean nothing there: the consumer processes nothing
// (kafkatx.LogChangedError) until the new log is adopted (`kafkatx offsets reset --mode
// adopt`, or Config.OnLogChange). It is checked before every other state. Drift.
const LogChanged State = "log_changed"

// LogID names a log: the cluster's id and the topic's id (Kafka's base64 forms). An empty
// field is unknown (not recorded yet, or a broker older than Kafka 2.8 gives no topic id) and
// is never taken for a change.
type LogID struct {
	Cluster, Topic string
}

// LogChange is what CompareLog found.
type LogChange struct {
	Recorded, Current LogID
	// Topic: both topic ids are known and differ; Cluster: both cluster ids are known and differ.
	Topic, Cluster bool
}

// Changed reports whether the log is another one.
func (c LogChange) Changed() bool { return c.Topic || c.Cluster }

// Missing reports whether current knows an id that recorded lacks (the row is filled on
// first contact).
func (c LogChange) Missing() bool {
	return (c.Recorded.Topic == "" && c.Current.Topic != "") || (c.Recorded.Cluster == "" && c.Current.Cluster != "")
}

// What says, in an operator's words, what changed: "topic id X -> Y (the topic was deleted
// and recreated)", "cluster id A -> B (another cluster)", or both.
func (c LogChange) What() string {
	var s string
	if c.Cluster {
		s = fmt.Sprintf("cluster id %s -> %s (another Kafka cluster: a disaster-recovery switch, a rebuilt cluster, or the brokers address changed)", msgfmt.Text(c.Recorded.Cluster), msgfmt.Text(c.Current.Cluster))
	}
	if c.Topic {
		if s != "" {
			s += ", "
		}
		s += fmt.Sprintf("topic id %s -> %s", msgfmt.Text(c.Recorded.Topic), msgfmt.Text(c.Current.Topic))
		if !c.Cluster {
			s += " (the topic was deleted and created again under the same name)"
		}
	}
	return s
}

// CompareLog compares the log recorded with a watermark with the one the broker describes
// now. It reads no state and has no effects.
func CompareLog(recorded, current LogID) LogChange {
	return LogChange{Recorded: recorded, Current: current,
		Topic:   recorded.Topic != "" && current.Topic != "" && recorded.Topic != current.Topic,
		Cluster: recorded.Cluster != "" && current.Cluster != "" && recorded.Cluster != current.Cluster}
}
