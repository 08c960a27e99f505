package kafkatx_test

import (
	"fmt"
	"sync/atomic"

	"github.com/confluentinc/confluent-kafka-go/v2/kafka"

	"github.com/kafkatx/kafkatx"
)

// deadLetterAlarm is a hook: it implements the one event it wants, HookDeadLettered.
type deadLetterAlarm struct{ n atomic.Int64 }

func (a *deadLetterAlarm) OnDeadLettered(e kafkatx.DeadLettered) {
	a.n.Add(1) // called on the loop's goroutine: quick, no blocking
	if e.ErrorClass == kafkatx.ErrorClassPanic {
		fmt.Printf("handler panicked on %s[%d]@%d after %d attempts\n", e.Topic, e.Partition, e.Offset, e.Attempts)
	}
}

var _ kafkatx.HookDeadLettered = (*deadLetterAlarm)(nil)

// A hook receives the loop's events after they happened; Config.Hooks takes any number, each
// implementing one or more Hook* interfaces.
func ExampleHook() {
	alarm := &deadLetterAlarm{}
	cfg := &kafkatx.Config{
		Kafka:  kafka.ConfigMap{"bootstrap.servers": "localhost:9092", "group.id": "orders-processor"},
		Topics: []string{"orders"},
		Hooks:  []kafkatx.Hook{alarm},
	}
	_ = cfg // kafkatx.NewConsumer(pool, handler, cfg)

	// What the Consumer calls once a dead letter committed:
	alarm.OnDeadLettered(kafkatx.DeadLettered{Group: "orders-processor", Topic: "orders", Partition: 1, Offset: 7, Attempts: 5, ErrorClass: kafkatx.ErrorClassPanic})
	fmt.Println(alarm.n.Load(), "dead letter")
	// Output:
	// handler panicked on orders[1]@7 after 5 attempts
	// 1 dead letter
}
