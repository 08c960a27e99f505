package kafkaname

import (
	"errors"
	"strings"
	"testing"
)

func TestTopic(t *testing.T) {
	for _, ok := range []string{"orders", "a", "A.b_c-9", strings.Repeat("x", MaxTopicLength), "..."} {
		if err := Topic(ok); err != nil {
			t.Errorf("Topic(%q) = %v, want nil", ok, err)
		}
	}
	for topic, want := range map[string]string{
		"":                                "empty",
		".":                               "Kafka refuses . and ..",
		"..":                              "Kafka refuses . and ..",
		strings.Repeat("x", 250):          "longer than 249 characters (250)",
		"atk-" + strings.Repeat("x", 509): "longer than 249 characters (513)",
		"a b":                             "only ASCII letters",
		"a/b":                             "only ASCII letters",
		"caf\u00e9":                       "only ASCII letters",
		strings.Repeat("\u00e9", 200):     "only ASCII letters", // 400 bytes, 200 characters
	} {
		err := Topic(topic)
		if err == nil || !errors.Is(err, ErrInvalidTopic) || !strings.Contains(err.Error(), want) {
			t.Errorf("Topic(%d bytes) = %v, want an ErrInvalidTopic saying %q", len(topic), err, want)
		}
		if r := Reason(topic); r == "" || strings.HasPrefix(r, ErrInvalidTopic.Error()) || !strings.Contains(r, want) {
			t.Errorf("Reason(%d bytes) = %q", len(topic), r)
		}
	}
	if !errors.Is(Topic(strings.Repeat("x", 250)), ErrTopicTooLong) || errors.Is(Topic("a b"), ErrTopicTooLong) {
		t.Error("ErrTopicTooLong wraps the length refusal only")
	}
}
