// Package canary holds the test that no secret kafkatx handles — a database URL's password,
// a SASL password, an Airflow token, an Authorization header passing through httpmw — shows
// in any output: stdout, stderr, /metrics, /readyz, dead-letter rows, stored responses, CLI
// output. It builds the binaries and provokes their failure paths with canary values
// (docs/failures.md, "No secret anywhere").
package canary
