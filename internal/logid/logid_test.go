package logid

import "testing"

func TestKafkaFormIsWhatKafkaTopicsPrints(t *testing.T) {
	// librdkafka's base64 of a UUID and Kafka's Uuid.toString of the same bytes.
	if got := kafkaForm("94KitawbT+SMuTYLYtcn/Q=="); got != "94KitawbT-SMuTYLYtcn_Q" {
		t.Fatalf("kafkaForm = %s", got)
	}
}
