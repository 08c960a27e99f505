package relay

import (
	"testing"
	"time"

	"github.com/confluentinc/confluent-kafka-go/v2/kafka"
)

// One kind of producer error is logged once every errorRepeat, the next line counting the
// ones held back; another code has its own allowance (a fresh-eyes attack: 606 warnings in
// 30 s with the brokers down).
func TestProducerErrorsAreLoggedOnceEveryErrorRepeat(t *testing.T) {
	var l errorLimiter
	t0 := time.Unix(1000, 0)
	logged := 0
	for i := range 600 { // one every 50 ms for 30 s
		if ok, _ := l.allow(kafka.ErrAllBrokersDown, t0.Add(time.Duration(i)*50*time.Millisecond)); ok {
			logged++
		}
	}
	if logged != 1 {
		t.Fatalf("%d of 600 errors in 30 s logged; want 1", logged)
	}
	if ok, _ := l.allow(kafka.ErrTransport, t0.Add(time.Second)); !ok {
		t.Fatal("another code held back by the first one's allowance")
	}
	ok, suppressed := l.allow(kafka.ErrAllBrokersDown, t0.Add(errorRepeat))
	if !ok || suppressed != 599 {
		t.Fatalf("after errorRepeat: logged %v with %d suppressed; want true, 599", ok, suppressed)
	}
}
