package publish

import (
	"fmt"
	"strings"

	"github.com/confluentinc/confluent-kafka-go/v2/kafka"
)

// RefuseSettings returns an error naming the first producer setting in kc that an outbox
// relay refuses, or nil. Both relays publish with the idempotent producer and acks=all, so a
// retried record is neither duplicated nor reordered in its partition (the table relay's
// per-key order and the WAL relay's transactions rest on it):
//   - enable.idempotence other than true;
//   - acks (or its alias request.required.acks) other than all / -1;
//   - transactional.id: the table relay runs no Kafka transaction (a transactional producer
//     refuses every produce outside one) and the WAL relay names its own from
//     walrelay.Config.TransactionalIDPrefix and the slot.
//
// The values named are librdkafka's enumerations, never a secret. The same settings are
// refused in both modes, and before anything connects: kafkatx relay and the examples exit
// with the usage status on them (relays.CheckKafka).
func RefuseSettings(kc kafka.ConfigMap) error {
	if v, ok := kc["enable.idempotence"]; ok && !strings.EqualFold(fmt.Sprint(v), "true") {
		return fmt.Errorf("enable.idempotence=%s is refused: the outbox relay publishes with the idempotent producer (no duplicates or reordering on retries)",
			enumValue(v))
	}
	if v, ok := kc["transactional.id"]; ok && fmt.Sprint(v) != "" {
		return fmt.Errorf("transactional.id is refused: the table relay publishes with an idempotent, non-transactional producer " +
			"(consumers deduplicate by the kafkatx-outbox-id header), and the WAL relay names its own (walrelay.Config.TransactionalIDPrefix + slot)")
	}
	for _, k := range []string{"acks", "request.required.acks"} {
		if v, ok := kc[k]; ok {
			if s := strings.ToLower(fmt.Sprint(v)); s != "all" && s != "-1" {
				return fmt.Errorf("%s=%s is refused: the outbox relay publishes with acks=all", k, enumValue(v))
			}
		}
	}
	return nil
}

// enumValue is v when it is one of the values these properties take (true, false, 0, 1, -1,
// all, in any case), else "…": a value put under the wrong property may be a secret.
func enumValue(v kafka.ConfigValue) string {
	switch s := strings.ToLower(fmt.Sprint(v)); s {
	case "true", "false", "0", "1", "-1", "all":
		return s
	}
	return "…"
}
