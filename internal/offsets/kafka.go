package offsets

import (
	"context"
	"fmt"
	"sort"
	"time"

	"github.com/confluentinc/confluent-kafka-go/v2/kafka"
	"go.uber.org/zap"

	"github.com/kafkatx/kafkatx/internal/kafkalog"
	"github.com/kafkatx/kafkatx/internal/logid"
	"github.com/kafkatx/kafkatx/internal/offsetstate"
	"github.com/kafkatx/kafkatx/internal/offsetstore"
)

// Kafka is the broker side of the offset commands: consumer-group offsets, log offsets and
// group membership, all through librdkafka's AdminClient (no consumer joins the group).
type Kafka struct {
	admin    *kafka.AdminClient
	producer *kafka.Producer // the admin client's handle: it takes a log channel, NewAdminClient does not
}

// NewKafka connects an AdminClient with cfg (bootstrap.servers is required; security
// settings such as sasl.* and ssl.* pass through). With a non-nil log, librdkafka's log lines
// go to it (zap JSON on stderr for the command) instead of raw text; cfg is not changed.
func NewKafka(cfg kafka.ConfigMap, log *zap.Logger) (*Kafka, error) {
	admin, p, err := kafkalog.NewAdminClient(log, cfg)
	if err != nil {
		return nil, fmt.Errorf("kafka admin client: %w", err)
	}
	// The handle's client-level events (broker down, transport errors) are read and dropped,
	// until Close closes the channel: its buffer is small (kafkaprops.SmallGoChannels), and a
	// full one parks the handle's Go poller for good (kafkalog.NewAdminClient).
	go func() {
		for range p.Events() {
		}
	}()
	return &Kafka{admin: admin, producer: p}, nil
}

// Reachable asks the cluster for its metadata and returns an error, naming bootstrap (the
// bootstrap servers as given), when no broker answered within timeout. The offset commands
// call it first, so an unreachable or mistyped address fails in timeout instead of after
// each call's own 30 to 60 s.
func (k *Kafka) Reachable(bootstrap string, timeout time.Duration) error {
	if _, err := k.admin.GetMetadata(nil, false, max(int(timeout.Milliseconds()), 1)); err != nil {
		return fmt.Errorf("kafka: no broker at %s answered within %v (%v): check --brokers or KAFKA_BOOTSTRAP_SERVERS, and the listener's security settings", bootstrap, timeout, err)
	}
	return nil
}

// Close releases the AdminClient.
func (k *Kafka) Close() {
	k.admin.Close()
	k.producer.Close()
}

// deadlineMs is the timeout, in milliseconds, of calls that take one instead of a context.
func deadlineMs(ctx context.Context) int {
	if d, ok := ctx.Deadline(); ok {
		return max(int(time.Until(d).Milliseconds()), 1)
	}
	return 30000
}

// Partitions returns the partition ids of topic in ascending order. A topic the broker does
// not know is an error.
func (k *Kafka) Partitions(ctx context.Context, topic string) ([]int32, error) {
	md, err := k.admin.GetMetadata(&topic, false, deadlineMs(ctx))
	if err != nil {
		return nil, fmt.Errorf("metadata of topic %s: %w", topic, err)
	}
	tm, ok := md.Topics[topic]
	if !ok || tm.Error.Code() == kafka.ErrUnknownTopicOrPart || tm.Error.Code() == kafka.ErrUnknownTopic {
		return nil, fmt.Errorf("topic %s does not exist", topic)
	}
	if tm.Error.Code() != kafka.ErrNoError {
		return nil, fmt.Errorf("metadata of topic %s: %w", topic, tm.Error)
	}
	out := make([]int32, 0, len(tm.Partitions))
	for _, p := range tm.Partitions {
		out = append(out, p.ID)
	}
	sort.Slice(out, func(i, j int) bool { return out[i] < out[j] })
	return out, nil
}

// Committed returns the group's committed offsets of tps; a partition with no committed
// offset is absent from the map. With no tps it returns every committed offset of the group.
func (k *Kafka) Committed(ctx context.Context, group string, tps []offsetstore.TP) (map[offsetstore.TP]int64, error) {
	out, _, err := k.CommittedMarks(ctx, group, tps)
	return out, err
}

// CommittedMarks is Committed that also returns the consumer's commit mark of each committed
// offset that carries one (offsetstate.CommitMark: the offset was committed by kafkatx's
// consumer; Kafka's tools and `kafkatx offsets reset` write none).
func (k *Kafka) CommittedMarks(ctx context.Context, group string, tps []offsetstore.TP) (map[offsetstore.TP]int64, map[offsetstore.TP]offsetstate.CommitMark, error) {
	req := kafka.ConsumerGroupTopicPartitions{Group: group}
	for _, tp := range tps {
		req.Partitions = append(req.Partitions, ktp(tp, kafka.OffsetInvalid))
	}
	res, err := k.admin.ListConsumerGroupOffsets(ctx, []kafka.ConsumerGroupTopicPartitions{req})
	if err != nil {
		return nil, nil, fmt.Errorf("committed offsets of group %s: %w", group, err)
	}
	out, marks := map[offsetstore.TP]int64{}, map[offsetstore.TP]offsetstate.CommitMark{}
	for _, g := range res.ConsumerGroupsTopicPartitions {
		for _, p := range g.Partitions {
			if p.Error != nil {
				return nil, nil, fmt.Errorf("committed offset of group %s %s[%d]: %w", group, *p.Topic, p.Partition, p.Error)
			}
			if p.Offset >= 0 {
				tp := offsetstore.TP{Topic: *p.Topic, Partition: p.Partition}
				out[tp] = int64(p.Offset)
				if p.Metadata != nil {
					if m, ok := offsetstate.ParseCommitMark(*p.Metadata); ok {
						marks[tp] = m
					}
				}
			}
		}
	}
	return out, marks, nil
}

// LogRange is a partition's log start offset (the oldest offset still stored) and log end
// offset (the offset the next record will get).
type LogRange struct {
	Start, End int64
}

// LogOffsets returns the log start and end offsets of tps (Kafka ListOffsets, earliest and
// latest).
func (k *Kafka) LogOffsets(ctx context.Context, tps []offsetstore.TP) (map[offsetstore.TP]LogRange, error) {
	start, err := k.listOffsets(ctx, tps, kafka.EarliestOffsetSpec)
	if err != nil {
		return nil, err
	}
	end, err := k.listOffsets(ctx, tps, kafka.LatestOffsetSpec)
	if err != nil {
		return nil, err
	}
	out := make(map[offsetstore.TP]LogRange, len(tps))
	for _, tp := range tps {
		out[tp] = LogRange{Start: start[tp], End: end[tp]}
	}
	return out, nil
}

// OffsetsForTime returns, per partition, the earliest offset whose record timestamp is at or
// after t (Kafka ListOffsets by timestamp, KIP-79), or the log end offset when every record
// is older.
func (k *Kafka) OffsetsForTime(ctx context.Context, tps []offsetstore.TP, t time.Time) (map[offsetstore.TP]int64, error) {
	at, err := k.listOffsets(ctx, tps, kafka.NewOffsetSpecForTimestamp(t.UnixMilli()))
	if err != nil {
		return nil, err
	}
	var missing []offsetstore.TP
	for _, tp := range tps {
		if at[tp] < 0 {
			missing = append(missing, tp)
		}
	}
	if len(missing) > 0 {
		end, err := k.listOffsets(ctx, missing, kafka.LatestOffsetSpec)
		if err != nil {
			return nil, err
		}
		for _, tp := range missing {
			at[tp] = end[tp]
		}
	}
	return at, nil
}

func (k *Kafka) listOffsets(ctx context.Context, tps []offsetstore.TP, spec kafka.OffsetSpec) (map[offsetstore.TP]int64, error) {
	req := make(map[kafka.TopicPartition]kafka.OffsetSpec, len(tps))
	for _, tp := range tps {
		req[ktp(tp, kafka.OffsetInvalid)] = spec
	}
	res, err := k.admin.ListOffsets(ctx, req, kafka.SetAdminIsolationLevel(kafka.IsolationLevelReadCommitted))
	if err != nil {
		return nil, fmt.Errorf("list offsets: %w", err)
	}
	out := make(map[offsetstore.TP]int64, len(tps))
	for p, info := range res.ResultInfos {
		tp := offsetstore.TP{Topic: *p.Topic, Partition: p.Partition}
		if info.Error.Code() != kafka.ErrNoError {
			return nil, fmt.Errorf("list offsets of %s: %w", tp, info.Error)
		}
		out[tp] = int64(info.Offset)
	}
	for _, tp := range tps {
		if _, ok := out[tp]; !ok {
			return nil, fmt.Errorf("list offsets: no answer for %s", tp)
		}
	}
	return out, nil
}

// Group is what the broker says about a consumer group.
type Group struct {
	// State is the group coordinator's state (Empty, Stable, PreparingRebalance, Dead, …).
	State string
	// Members describes each active member as "client.id on host (member id)". A static
	// member (group.instance.id, KIP-345) stays listed until its session times out, even
	// after its process died.
	Members []string
}

// DescribeGroup returns the group's state and active members (Kafka DescribeGroups).
func (k *Kafka) DescribeGroup(ctx context.Context, group string) (Group, error) {
	res, err := k.admin.DescribeConsumerGroups(ctx, []string{group})
	if err != nil {
		return Group{}, fmt.Errorf("describe group %s: %w", group, err)
	}
	if len(res.ConsumerGroupDescriptions) == 0 {
		return Group{State: "Dead"}, nil
	}
	d := res.ConsumerGroupDescriptions[0] // one group asked, one answer
	if d.Error.Code() != kafka.ErrNoError && d.Error.Code() != kafka.ErrGroupIDNotFound {
		return Group{}, fmt.Errorf("describe group %s: %w", group, d.Error)
	}
	g := Group{State: d.State.String()}
	for _, m := range d.Members {
		g.Members = append(g.Members, fmt.Sprintf("%s on %s (%s)", m.ClientID, m.Host, m.ConsumerID))
	}
	return g, nil
}

// Commit sets the group's committed offsets (Kafka AlterConsumerGroupOffsets, what
// kafka-consumer-groups --reset-offsets does). The broker refuses it while the group has
// members.
func (k *Kafka) Commit(ctx context.Context, group string, offsets map[offsetstore.TP]int64) error {
	req := kafka.ConsumerGroupTopicPartitions{Group: group}
	for tp, off := range offsets {
		req.Partitions = append(req.Partitions, ktp(tp, kafka.Offset(off)))
	}
	res, err := k.admin.AlterConsumerGroupOffsets(ctx, []kafka.ConsumerGroupTopicPartitions{req})
	if err != nil {
		return fmt.Errorf("commit offsets of group %s: %w", group, err)
	}
	for _, g := range res.ConsumerGroupsTopicPartitions {
		for _, p := range g.Partitions {
			if p.Error != nil {
				return fmt.Errorf("commit offset %d of group %s %s[%d]: %w", offsets[offsetstore.TP{Topic: *p.Topic, Partition: p.Partition}], group, *p.Topic, p.Partition, p.Error)
			}
		}
	}
	return nil
}

func ktp(tp offsetstore.TP, off kafka.Offset) kafka.TopicPartition {
	topic := tp.Topic
	return kafka.TopicPartition{Topic: &topic, Partition: tp.Partition, Offset: off}
}

// LogIDs returns the cluster id and each topic's id (logid.Read).
func (k *Kafka) LogIDs(ctx context.Context, topics []string) (map[string]offsetstate.LogID, error) {
	return logid.Read(ctx, k.admin, topics)
}
