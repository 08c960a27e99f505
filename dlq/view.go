package dlq

import (
	"strings"
	"time"

	"github.com/kafkatx/kafkatx/pg"
)

// View is a dead letter's fields as JSON, the one shape that `kafkatx dlq list|show --output
// json` and the console's GET /api/dead-letters share: each embeds it and adds only how it
// shows the key, the value and the headers (bytes that may hold personal data). Times are
// RFC 3339; Timestamp (the original record's) and ResolvedAt are omitted when unknown.
type View struct {
	ID           int64      `json:"id"`
	Status       string     `json:"status"`
	Group        string     `json:"group"`
	Topic        string     `json:"topic"`
	Partition    int32      `json:"partition"`
	Offset       int64      `json:"offset"`
	Timestamp    *time.Time `json:"timestamp,omitempty"`
	ErrorClass   string     `json:"error_class"`
	ErrorMessage string     `json:"error_message"` // ErrorLine's in lists; in full where a view says so
	Attempts     int        `json:"attempts"`
	FirstFailure time.Time  `json:"first_failure"`
	LastFailure  time.Time  `json:"last_failure"`
	ReplayEpoch  int        `json:"replay_epoch"`
	// TopicID and ClusterID name the log the message came from (DeadLetter.TopicID); omitted
	// when unknown. Two dead letters of one (group, topic, partition, offset) differ in them:
	// the topic was deleted and created again, or another cluster, and the new log adopted.
	TopicID    string     `json:"topic_id,omitempty"`
	ClusterID  string     `json:"cluster_id,omitempty"`
	CreatedAt  time.Time  `json:"created_at"`
	ResolvedAt *time.Time `json:"resolved_at,omitempty"`
}

// ViewOf returns d's View; ErrorMessage is ErrorLine(d.ErrorMessage) unless fullError.
func ViewOf(d *DeadLetter, fullError bool) View {
	v := View{ID: d.ID, Status: d.Status, Group: d.Group, Topic: d.Topic, Partition: d.Partition, Offset: d.Offset,
		ErrorClass: d.ErrorClass, ErrorMessage: d.ErrorMessage, Attempts: d.Attempts, FirstFailure: d.FirstFailureAt,
		LastFailure: d.LastFailureAt, ReplayEpoch: d.ReplayEpoch, CreatedAt: d.CreatedAt, ResolvedAt: d.ResolvedAt,
		TopicID: d.TopicID, ClusterID: d.ClusterID}
	if !d.Timestamp.IsZero() {
		ts := d.Timestamp
		v.Timestamp = &ts
	}
	if !fullError {
		v.ErrorMessage = ErrorLine(d.ErrorMessage)
	}
	return v
}

// ErrorLine is an error message as a list shows it: its first line, at most 160 bytes
// (pg.SanitizeText: invalid UTF-8 and NUL replaced), followed by " …" when anything was cut.
func ErrorLine(s string) string {
	cut := false
	if i := strings.IndexByte(s, '\n'); i >= 0 {
		s, cut = s[:i], true
	}
	if len(s) > 160 {
		cut = true
	}
	s = pg.SanitizeText(s, 160)
	if cut {
		s += " …"
	}
	return s
}
