package publish

import (
	"errors"
	"testing"

	"github.com/confluentinc/confluent-kafka-go/v2/kafka"
)

// TestClassifyGivesOneOutcomePerCode pins the outcome of every code the two relays once
// disagreed on, and the batch rule: a record-level refusal isolates while batched and parks
// alone; a topic-level one parks either way.
func TestClassifyGivesOneOutcomePerCode(t *testing.T) {
	for _, c := range []struct {
		code         kafka.ErrorCode
		alone, batch Class
	}{
		{kafka.ErrUnsupportedForMessageFormat, Park, Park},
		{kafka.ErrInvalidMsg, Retry, Retry},
		{kafka.ErrInvalidRequiredAcks, Retry, Retry},
		{kafka.ErrMsgSizeTooLarge, Park, Isolate},
		{kafka.ErrInvalidRecord, Park, Isolate},
		{kafka.ErrRecordListTooLarge, Park, Isolate},
		{kafka.ErrUnknownTopicOrPart, Park, Park},
		{kafka.ErrTopicAuthorizationFailed, Park, Park},
		{kafka.ErrClusterAuthorizationFailed, Retry, Retry},
		{kafka.ErrMsgTimedOut, Retry, Retry},
		{kafka.ErrNotLeaderForPartition, Retry, Retry},
	} {
		if got, why := ClassifyCode(c.code, true); got != c.alone || why == "" {
			t.Errorf("%v alone: %v (%q), want %v", c.code, got, why, c.alone)
		}
		if got, _ := ClassifyCode(c.code, false); got != c.batch {
			t.Errorf("%v batched: %v, want %v", c.code, got, c.batch)
		}
	}
	if got, _ := Classify(errors.New("not kafka"), true); got != Retry {
		t.Errorf("a non-Kafka error: %v, want retry", got)
	}
	if got, _ := Classify(kafka.NewError(kafka.ErrMsgSizeTooLarge, "x", false), true); got != Park {
		t.Errorf("a wrapped kafka.Error: %v, want park", got)
	}
	for code, r := range refusals {
		if r.reason == "" {
			t.Errorf("%v has no reason", code)
		}
	}
}

func TestLimitsRefuseANilKeyOnACompactedTopicOnly(t *testing.T) {
	if err := (Limits{Compacted: true}).RefusesNilKey(nil); !errors.Is(err, ErrNilKeyOnCompactedTopic) {
		t.Errorf("nil key, compacted: %v", err)
	}
	if err := (Limits{Compacted: true}).RefusesNilKey([]byte{}); err != nil {
		t.Errorf("empty key, compacted: %v", err)
	}
	if err := (Limits{}).RefusesNilKey(nil); err != nil {
		t.Errorf("nil key, not compacted: %v", err)
	}
}
