package offsets

import (
	"context"
	"fmt"
	"sort"
	"time"

	"github.com/kafkatx/kafkatx/internal/offsetstate"
	"github.com/kafkatx/kafkatx/internal/offsetstore"
	"github.com/kafkatx/kafkatx/internal/parking"
)

// PartitionStatus is one partition's view of both sides. Offsets are Kafka offsets; the
// watermark is the next offset to process.
type PartitionStatus struct {
	// Shard names the shard whose database holds the partition's watermark, when the command
	// reads a sharded group (kafkatx --shard); empty otherwise.
	Shard     string `json:"shard,omitempty"`
	Group     string `json:"group"`
	Topic     string `json:"topic"`
	Partition int32  `json:"partition"`
	// Watermark is the database's next offset to process (nil: none recorded).
	Watermark *int64 `json:"watermark"`
	// Committed is the group's committed offset in Kafka (nil: none).
	Committed *int64 `json:"committed"`
	// LogStart and LogEnd are the oldest stored offset and the next offset to be written.
	LogStart int64 `json:"log_start"`
	LogEnd   int64 `json:"log_end"`
	// Lag is LogEnd minus the watermark (or the committed offset when there is no
	// watermark, or LogStart when neither exists), in messages. When State is
	// offsetstate.LogChanged the watermark counts offsets of another log, so it is not
	// subtracted: Lag is LogEnd minus LogStart, the records the new log holds, none of which
	// is applied (the consumer halts until the new log is adopted), and Drift is nil.
	Lag int64 `json:"lag"`
	// Drift is Committed minus Watermark (nil when either is missing): > 0 Kafka ahead,
	// < 0 Kafka behind.
	Drift *int64 `json:"drift"`
	// State is the classifier's name for the partition's offsets (offsetstate.State): the
	// consumer decides its start from the same classification.
	State offsetstate.State `json:"state"`
	// ReplayEpoch counts the replays of the partition (0 before the first).
	ReplayEpoch int `json:"replay_epoch"`
	// DoneAbove counts offsets above the watermark a consumer with Config.Concurrency > 1
	// already applied (units commit out of offset order); the watermark and Kafka's offset are
	// the lowest offset not yet done, and the consumer skips these after a restart. 0 with
	// Concurrency 1.
	DoneAbove int64 `json:"done_above"`
	// Parked counts the partition's parked messages (kafkatx.Config.Park, table key_parking):
	// below the watermark and accounted for, waiting for their key; ParkedKeys their keys.
	Parked     int64 `json:"parked"`
	ParkedKeys int64 `json:"parked_keys"`
	// LastEvent is the newest offset audit row of the partition, if any.
	LastEvent *offsetstore.Event `json:"last_event"`
	// Pending lists operator commands recorded but not yet applied (an operator skip waiting
	// for the consumer to follow Kafka, or a command that stopped half way).
	Pending []offsetstore.Event `json:"pending,omitempty"`
	// StaleCopies lists, for a sharded group, the partition's watermark rows on shards the
	// shard directory does not map it to (shards.StaleCopies: a shard restored from an older
	// backup, a copy a failed move left): consumers never apply there; offsets status counts
	// a partition with one as drift. Watermark and Shard are the mapped shard's.
	StaleCopies []StaleCopy `json:"stale_copies,omitempty"`
	// WatermarkUpdatedAt is when the watermark last moved (nil: no watermark).
	WatermarkUpdatedAt *time.Time `json:"watermark_updated_at,omitempty"`
	// Log names the log the watermark was recorded in and the one the broker describes now
	// (nil: no watermark); State is offsetstate.LogChanged when they differ.
	Log *LogIdentity `json:"log,omitempty"`
}

// StaleCopy is a partition's watermark row on a shard the directory does not map it to.
type StaleCopy struct {
	Shard     string `json:"shard"`
	Watermark int64  `json:"watermark"`
}

// LogIdentity is a watermark's recorded log and the current one: topic ids (KIP-516) and
// cluster ids, "" when unknown (a row older than migration 009 shows "" until the consumer
// meets the partition).
type LogIdentity struct {
	RecordedTopicID   string `json:"recorded_topic_id"`
	TopicID           string `json:"topic_id"`
	RecordedClusterID string `json:"recorded_cluster_id"`
	ClusterID         string `json:"cluster_id"`
}

// Change is the comparison of the two logs (offsetstate.CompareLog).
func (l *LogIdentity) Change() offsetstate.LogChange {
	if l == nil {
		return offsetstate.LogChange{}
	}
	return offsetstate.CompareLog(offsetstate.LogID{Cluster: l.RecordedClusterID, Topic: l.RecordedTopicID},
		offsetstate.LogID{Cluster: l.ClusterID, Topic: l.TopicID})
}

// Stalled reports lag with no progress: records wait (Lag > 0) and the watermark has not
// moved for at least d — a stuck handler, an open breaker, a condition waited out, or no
// consumer running. Aligned offsets do not make a partition healthy.
// A log_changed partition is not stalled: its state already says why nothing moves.
func (s PartitionStatus) Stalled(d time.Duration, now time.Time) bool {
	return s.State != offsetstate.LogChanged && s.Lag > 0 && s.WatermarkUpdatedAt != nil && now.Sub(*s.WatermarkUpdatedAt) >= d
}

// Drifted reports whether the two sides disagree in a way the consumer would repair, audit
// or halt on at its next assignment (offsetstate.State.Drift).
func (s PartitionStatus) Drifted() bool { return s.State.Drift() }

// Status compares, per partition of topic (every topic the group has a watermark or a
// committed offset on when topic is ""), the watermark with Kafka's committed offset and the
// log's start and end offsets. Partitions are sorted by topic and partition.
func (o *Operator) Status(ctx context.Context, group, topic string) ([]PartitionStatus, error) {
	ws, err := o.store.Watermarks(ctx, o.pool, group, nil)
	if err != nil {
		return nil, err
	}
	var topicsList []string
	if topic != "" {
		topicsList = []string{topic}
	} else {
		seen := map[string]bool{}
		for tp := range ws {
			seen[tp.Topic] = true
		}
		all, err := o.kafka.Committed(ctx, group, nil)
		if err != nil {
			return nil, err
		}
		for tp := range all {
			seen[tp.Topic] = true
		}
		for t := range seen {
			topicsList = append(topicsList, t)
		}
		sort.Strings(topicsList)
	}
	var tps []offsetstore.TP
	for _, t := range topicsList {
		ps, err := o.topicPartitions(ctx, t, -1)
		if err != nil {
			return nil, err
		}
		tps = append(tps, ps...)
	}
	if len(tps) == 0 {
		return nil, nil
	}
	committed, marks, err := o.kafka.CommittedMarks(ctx, group, tps)
	if err != nil {
		return nil, err
	}
	db, err := offsetstore.Database(ctx, o.pool)
	if err != nil {
		return nil, err
	}
	logs, err := o.kafka.LogOffsets(ctx, tps)
	if err != nil {
		return nil, err
	}
	ids, err := o.kafka.LogIDs(ctx, topicsList)
	if err != nil {
		return nil, err
	}
	last, pending, err := o.latestEvents(ctx, group)
	if err != nil {
		return nil, err
	}
	out := make([]PartitionStatus, 0, len(tps))
	for _, tp := range tps {
		s := PartitionStatus{Group: group, Topic: tp.Topic, Partition: tp.Partition,
			LogStart: logs[tp].Start, LogEnd: logs[tp].End, Pending: pending[tp]}
		if e, ok := last[tp]; ok {
			s.LastEvent = &e
		}
		w, hasW := ws[tp]
		k, hasK := committed[tp]
		if hasW {
			s.Watermark = ptr(w.Next)
			s.ReplayEpoch = w.ReplayEpoch
			s.WatermarkUpdatedAt = ptr(w.UpdatedAt)
			done, err := o.store.Done(ctx, o.pool, group, tp, w.Next)
			if err != nil {
				return nil, err
			}
			s.DoneAbove = int64(len(done))
			counts, err := parking.New(o.t.Schema).Counts(ctx, o.pool, group, tp.Topic, tp.Partition)
			if err != nil {
				return nil, err
			}
			for _, n := range counts {
				s.Parked += int64(n)
				s.ParkedKeys++
			}
		}
		if hasK {
			s.Committed = ptr(k)
		}
		mark, marked := marks[tp]
		here, err := o.store.MarkedHere(ctx, o.pool, group, tp, mark, marked, db, w.Next, hasW, k, hasK) // as the consumer decides
		if err != nil {
			return nil, err
		}
		s.State = offsetstate.Classify(offsetstate.Offsets{W: w.Next, HasW: hasW, K: k, HasK: hasK, LogStart: s.LogStart, LogEnd: s.LogEnd,
			KMarkedHere: here}, offsetstate.Policy{}).State
		if hasW {
			cur := ids[tp.Topic]
			s.Log = &LogIdentity{RecordedTopicID: w.TopicID, TopicID: cur.Topic, RecordedClusterID: w.ClusterID, ClusterID: cur.Cluster}
			if s.Log.Change().Changed() { // checked before every other state, as the consumer does
				s.State = offsetstate.LogChanged
			}
		}
		switch {
		case s.State == offsetstate.LogChanged: // offsets of two logs: no difference means anything
			s.Lag = s.LogEnd - s.LogStart
		case hasW && hasK:
			s.Drift = ptr(k - w.Next)
			s.Lag = s.LogEnd - w.Next
		case hasW:
			s.Lag = s.LogEnd - w.Next
		case hasK:
			s.Lag = s.LogEnd - k
		default:
			s.Lag = s.LogEnd - s.LogStart
		}
		out = append(out, s)
	}
	return out, nil
}

// latestEvents returns the newest audit row and the pending rows of each partition of group.
func (o *Operator) latestEvents(ctx context.Context, group string) (map[offsetstore.TP]offsetstore.Event, map[offsetstore.TP][]offsetstore.Event, error) {
	rows, err := o.pool.Query(ctx, `SELECT id, group_id, topic, partition, kind, from_offset, to_offset, reason, actor, status, at
		FROM `+o.t.OffsetAudit+` a
		WHERE group_id = $1 AND (status = 'pending' OR id = (SELECT max(id) FROM `+o.t.OffsetAudit+` b
			WHERE b.group_id = a.group_id AND b.topic = a.topic AND b.partition = a.partition))
		ORDER BY id`, group)
	if err != nil {
		return nil, nil, fmt.Errorf("read latest offset audit: %w", err)
	}
	defer rows.Close()
	last := map[offsetstore.TP]offsetstore.Event{}
	pending := map[offsetstore.TP][]offsetstore.Event{}
	for rows.Next() {
		e, err := scanEvent(rows)
		if err != nil {
			return nil, nil, err
		}
		tp := offsetstore.TP{Topic: e.Topic, Partition: e.Partition}
		if e.Status == StatusPending {
			pending[tp] = append(pending[tp], e)
		}
		if cur, ok := last[tp]; !ok || e.ID > cur.ID {
			last[tp] = e
		}
	}
	if err := rows.Err(); err != nil {
		return nil, nil, fmt.Errorf("read latest offset audit: %w", err)
	}
	return last, pending, nil
}

type scanner interface{ Scan(dest ...any) error }

func scanEvent(r scanner) (offsetstore.Event, error) {
	var e offsetstore.Event
	if err := r.Scan(&e.ID, &e.Group, &e.Topic, &e.Partition, &e.Kind, &e.From, &e.To, &e.Reason, &e.Actor, &e.Status, &e.At); err != nil {
		return e, fmt.Errorf("read offset audit: %w", err)
	}
	return e, nil
}

func ptr[T any](v T) *T { return &v }
