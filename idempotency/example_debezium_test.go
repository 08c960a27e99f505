package idempotency_test

import (
	"fmt"

	"github.com/kafkatx/kafkatx/idempotency"
)

// A Debezium change event from the PostgreSQL connector gets its source position and a
// digest of its record key as its idempotency key; the same event re-published at another
// offset gets the same key.
func ExampleFromDebezium() {
	keyOf := idempotency.FromDebezium()
	value := []byte(`{"before":null,"after":{"id":7,"status":"active"},` +
		`"source":{"connector":"postgresql","name":"app","db":"app","schema":"public","table":"customers","lsn":24023128,"txId":555},` +
		`"op":"c","ts_ms":1790000000000}`)
	for _, offset := range []int64{41, 97} {
		key, ok, err := keyOf(idempotency.Message{Topic: "app.public.customers", Offset: offset, Key: []byte(`{"id":7}`), Value: value})
		fmt.Println(offset, key, ok, err)
	}
	// Output:
	// 41 dbz2:pg:app:app.public.customers:c:24023128:555:-:ka3c90e3b7448d23d9eacebd0ebf15cae true <nil>
	// 97 dbz2:pg:app:app.public.customers:c:24023128:555:-:ka3c90e3b7448d23d9eacebd0ebf15cae true <nil>
}
