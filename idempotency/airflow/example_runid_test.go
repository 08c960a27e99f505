package airflow_test

import (
	"fmt"

	"github.com/kafkatx/kafkatx/idempotency/airflow"
)

// Run ids are derived from idempotency keys: readable when the key is made of the characters
// Airflow accepts in run ids, hashed otherwise.
func ExampleRunID() {
	fmt.Println(airflow.RunID("", "pg:app:app.public.customers:c:24023128:555"))
	fmt.Println(airflow.RunID("", "orders/42"))
	// Output:
	// kafkatx__pg:app:app.public.customers:c:24023128:555
	// kafkatx__~c4dd165f06c35f87f80d9c755d8703efce751ab5c5f0efc6a819993f57629ced
}
