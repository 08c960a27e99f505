package airflow_test

import (
	"fmt"

	"github.com/kafkatx/kafkatx/idempotency/airflow"
)

// Run ids are derived from idempotency keys: readable when the key makes an id Airflow
// accepts, hashed otherwise (a character outside its pattern, or a ".." that Airflow refuses
// as path traversal).
func ExampleRunID() {
	fmt.Println(airflow.RunID("", "pg:app:app.public.customers:c:24023128:555"))
	fmt.Println(airflow.RunID("", "orders/42"))
	fmt.Println(airflow.RunID("", "pg:app:app..customers:c:24023128:555"))
	// Output:
	// kafkatx__pg:app:app.public.customers:c:24023128:555
	// kafkatx__~c4dd165f06c35f87f80d9c755d8703efce751ab5c5f0efc6a819993f57629ced
	// kafkatx__~e8ec016757ead1aa6abdbbe9e270c4754e59208b5c7f9b7971d693eb99efc08d
}
