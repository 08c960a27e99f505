// Package logid reads which log a topic name points at — the cluster's id and the topic's id
// (KIP-516) — with librdkafka's admin client, for the consumer's start decision (on every
// assignment) and the offset commands (offsets status, offsets reset --mode adopt): one
// reading, one rule (docs/offsets.md, "Which log a watermark is in").
package logid

import (
	"context"
	"fmt"
	"sort"
	"strings"

	"github.com/confluentinc/confluent-kafka-go/v2/kafka"

	"github.com/kafkatx/kafkatx/internal/offsetstate"
)

// Read returns, per topic of topics, the cluster id (DescribeCluster) and the topic id
// (DescribeTopics by name), as Kafka's tools print them: two admin requests however many topics. A topic id of zero (a
// broker before Kafka 2.8) is returned as "" (unknown), as is a nil cluster id. A topic the
// broker does not know, or any other per-topic error, fails the whole read: the caller
// retries or reports it, never decides without it.
func Read(ctx context.Context, admin *kafka.AdminClient, topics []string) (map[string]offsetstate.LogID, error) {
	names := append([]string(nil), topics...)
	sort.Strings(names)
	names = uniq(names)
	cl, err := admin.DescribeCluster(ctx)
	if err != nil {
		return nil, fmt.Errorf("describe cluster: %w", err)
	}
	cluster := ""
	if cl.ClusterID != nil {
		cluster = *cl.ClusterID
	}
	out := make(map[string]offsetstate.LogID, len(names))
	if len(names) == 0 {
		return out, nil
	}
	res, err := admin.DescribeTopics(ctx, kafka.NewTopicCollectionOfTopicNames(names))
	if err != nil {
		return nil, fmt.Errorf("describe topics %v: %w", names, err)
	}
	for _, d := range res.TopicDescriptions {
		if d.Error.Code() != kafka.ErrNoError {
			return nil, fmt.Errorf("describe topic %s: %w", d.Name, d.Error)
		}
		id := ""
		if d.TopicID.GetMostSignificantBits() != 0 || d.TopicID.GetLeastSignificantBits() != 0 {
			id = kafkaForm(d.TopicID.String())
		}
		out[d.Name] = offsetstate.LogID{Cluster: cluster, Topic: id}
	}
	for _, n := range names {
		if _, ok := out[n]; !ok {
			return nil, fmt.Errorf("describe topics: no answer for %s", n)
		}
	}
	return out, nil
}

// kafkaForm writes a topic id as Kafka's own tools print it (kafka-topics --describe's
// TopicId: Uuid.toString, URL-safe base64 without padding); librdkafka gives standard base64.
func kafkaForm(b64 string) string {
	return strings.NewReplacer("+", "-", "/", "_", "=", "").Replace(b64)
}

func uniq(s []string) []string {
	out := s[:0]
	for i, v := range s {
		if i == 0 || v != s[i-1] {
			out = append(out, v)
		}
	}
	return out
}
