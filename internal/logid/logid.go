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
	"time"

	"github.com/confluentinc/confluent-kafka-go/v2/kafka"

	"github.com/kafkatx/kafkatx/internal/offsetstate"
)

// Read returns, per topic of topics, the cluster id and the topic id (DescribeTopics by name),
// as Kafka's tools print them: one admin request however many topics. A topic id of zero (a
// broker before Kafka 2.8) is returned as "" (unknown). A topic the broker does not know, or
// any other per-topic error, fails the whole read: the caller retries or reports it, never
// decides without it.
//
// The cluster id is the one of the client's last metadata response (AdminClient.ClusterID,
// rd_kafka_clusterid: no request), read after the DescribeTopics answer so it is at least as
// fresh; a DescribeCluster request is not sent. librdkafka 2.11.1 aborts the process
// (rd_kafka_admin_response_parse: Assertion `rko_result' failed) when a DescribeCluster is
// answered with no broker and no topic — what a frozen broker (SIGSTOP, a long pause) that
// the controller fenced meanwhile answers in the seconds after it resumes: the metadata parse
// returns "partial" without a buffer error, the DescribeCluster parser passes on that empty
// error and no result. A DescribeTopics names its topics, so its answer always has one and
// cannot take that path (docs/offsets.md, "Which log a watermark is in").
//
// The request's own timeout in librdkafka is ctx's deadline (10 s without one), so a request
// the caller gave up on is dropped by librdkafka rather than answered later, possibly while
// the client is closing.
func Read(ctx context.Context, admin *kafka.AdminClient, topics []string) (map[string]offsetstate.LogID, error) {
	names := append([]string(nil), topics...)
	sort.Strings(names)
	names = uniq(names)
	if _, ok := ctx.Deadline(); !ok {
		var cancel context.CancelFunc
		ctx, cancel = context.WithTimeout(ctx, 10*time.Second)
		defer cancel()
	}
	deadline, _ := ctx.Deadline()
	out := make(map[string]offsetstate.LogID, len(names))
	var res kafka.DescribeTopicsResult
	if len(names) > 0 {
		var err error
		res, err = admin.DescribeTopics(ctx, kafka.NewTopicCollectionOfTopicNames(names),
			kafka.SetAdminRequestTimeout(max(time.Until(deadline), time.Millisecond)))
		if err != nil {
			return nil, fmt.Errorf("describe topics %v: %w", names, err)
		}
	}
	cluster, err := admin.ClusterID(ctx)
	if err != nil {
		return nil, fmt.Errorf("cluster id: %w", err)
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
