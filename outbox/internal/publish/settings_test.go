package publish

import (
	"strings"
	"testing"

	"github.com/confluentinc/confluent-kafka-go/v2/kafka"
)

// Both relays refuse the same producer settings (one rule: a setting refused in one mode and
// silently replaced in the other was the WAL relay's way before), by property name, never
// echoing a value that is not one of the property's own.
func TestRefuseSettings(t *testing.T) {
	for _, c := range []struct {
		kc   kafka.ConfigMap
		want string // "" accepted
	}{
		{kafka.ConfigMap{}, ""},
		{kafka.ConfigMap{"acks": "all", "enable.idempotence": true}, ""},
		{kafka.ConfigMap{"acks": "-1", "enable.idempotence": "TRUE"}, ""},
		{kafka.ConfigMap{"request.required.acks": -1}, ""},
		{kafka.ConfigMap{"transactional.id": ""}, ""},
		{kafka.ConfigMap{"acks": "1"}, "acks=1 is refused"},
		{kafka.ConfigMap{"acks": 0}, "acks=0 is refused"},
		{kafka.ConfigMap{"request.required.acks": "1"}, "request.required.acks=1 is refused"},
		{kafka.ConfigMap{"enable.idempotence": false}, "enable.idempotence=false is refused"},
		{kafka.ConfigMap{"enable.idempotence": "s3cret"}, "enable.idempotence=… is refused"},
		{kafka.ConfigMap{"acks": "s3cret-pw"}, "acks=… is refused"},
		{kafka.ConfigMap{"transactional.id": "s3cret"}, "transactional.id is refused"},
	} {
		err := RefuseSettings(c.kc)
		switch {
		case c.want == "" && err != nil:
			t.Errorf("%v: refused (%v), want accepted", c.kc, err)
		case c.want != "" && (err == nil || !strings.Contains(err.Error(), c.want)):
			t.Errorf("%v: %v, want an error with %q", c.kc, err, c.want)
		case err != nil && strings.Contains(err.Error(), "s3cret"):
			t.Errorf("%v: the error shows the value: %v", c.kc, err)
		}
	}
}
