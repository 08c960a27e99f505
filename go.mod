module github.com/kafkatx/kafkatx

go 1.26

require (
	github.com/alecthomas/kong v1.17.0 // indirect
	github.com/cenkalti/backoff/v5 v5.0.3 // indirect
	github.com/confluentinc/confluent-kafka-go/v2 v2.11.1 // indirect
	github.com/jackc/pgpassfile v1.0.0 // indirect
	github.com/jackc/pgservicefile v0.0.0-20240606120523-5a60cdf6a761 // indirect
	github.com/jackc/pgx/v5 v5.12.0 // indirect
	github.com/prometheus/client_golang v1.25.0 // indirect
	go.uber.org/goleak v1.3.0 // indirect
	go.uber.org/multierr v1.10.0 // indirect
	go.uber.org/zap v1.28.0 // indirect
	golang.org/x/text v0.42.0 // indirect
)
