// Command kafkatx is kafkatx's operator and sidecar binary: migrations, the outbox relay,
// dead-letter tooling and offset repairs. Every subcommand takes --database-url, --brokers
// and --schema, falling back to DATABASE_URL and KAFKA_BOOTSTRAP_SERVERS.
package main

import (
	"context"
	"errors"
	"fmt"
	"os"
	"os/signal"
	"syscall"

	"github.com/alecthomas/kong"
	"github.com/jackc/pgx/v5/pgxpool"
	"go.uber.org/zap"
)

// Globals are the flags every subcommand takes.
type Globals struct {
	DatabaseURL string `name:"database-url" env:"DATABASE_URL" help:"PostgreSQL URL (postgres://user:pass@host:port/db)."`
	Brokers     string `name:"brokers" env:"KAFKA_BOOTSTRAP_SERVERS" help:"Kafka bootstrap servers, host:port[,host:port]."`
	Schema      string `name:"schema" default:"kafkatx" help:"Schema of kafkatx's tables."`
	LogLevel    string `name:"log-level" default:"info" enum:"debug,info,warn,error" help:"Log level (logs go to stderr)."`

	DatabaseURLFile  string   `name:"database-url-file" env:"KAFKATX_DATABASE_URL_FILE" type:"path" help:"Read the PostgreSQL URL from this file (overrides --database-url; keeps the password out of the environment and the process list)."`
	KafkaConfigFile  string   `name:"kafka-config-file" env:"KAFKATX_KAFKA_CONFIG_FILE" type:"path" help:"librdkafka properties file, one key=value per line (# comments): security.protocol, sasl.*, ssl.*, ... May hold secrets; values are never logged."`
	KafkaConfig      []string `name:"kafka-config" short:"X" sep:"none" help:"librdkafka property key=value (repeatable; after --kafka-config-file). Put secrets in files, not here."`
	SecurityProtocol string   `name:"security-protocol" env:"KAFKATX_SECURITY_PROTOCOL" help:"security.protocol: plaintext, ssl, sasl_plaintext or sasl_ssl."`
	SASLMechanism    string   `name:"sasl-mechanism" env:"KAFKATX_SASL_MECHANISM" help:"sasl.mechanism: PLAIN, SCRAM-SHA-256, SCRAM-SHA-512 or OAUTHBEARER."`
	SASLUsername     string   `name:"sasl-username" env:"KAFKATX_SASL_USERNAME" help:"sasl.username."`
	SASLPasswordFile string   `name:"sasl-password-file" env:"KAFKATX_SASL_PASSWORD_FILE" type:"path" help:"Read sasl.password from this file (trailing newline dropped)."`
}

// CLI is the whole command line. Each subcommand lives in its own file.
type CLI struct {
	Globals

	Migrate MigrateCmd `cmd:"" help:"Apply or print kafkatx's schema migrations."`
	Offsets OffsetsCmd `cmd:"" help:"Offsets: the database leads, Kafka follows (status, reset, audit, account)."`
	Relay   RelayCmd   `cmd:"" help:"Publish the outbox to Kafka (the sidecar): leader election, NOTIFY wake-up, health endpoint."`
	Outbox  OutboxCmd  `cmd:"" help:"Parked outbox rows: list, release, discard."`
	DLQ     DLQCmd     `cmd:"" name:"dlq" help:"Dead letters: list, show, replay through the outbox, discard (audited)."`
}

// exitError carries a specific exit status (for example 3 for drift).
type exitError struct {
	code int
	err  error
}

func (e *exitError) Error() string {
	if e.err == nil {
		return fmt.Sprintf("exit status %d", e.code)
	}
	return e.err.Error()
}

func main() {
	var cli CLI
	kctx := kong.Parse(&cli,
		kong.Name("kafkatx"),
		kong.Description("Operate kafkatx: migrations, the outbox relay sidecar, dead letters and offsets."),
		kong.UsageOnError(),
	)
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGTERM, syscall.SIGINT)
	kctx.BindTo(ctx, (*context.Context)(nil)) // commands take the interface type
	err := kctx.Run(&cli.Globals)
	stop()
	var ee *exitError
	switch {
	case errors.As(err, &ee):
		if ee.err != nil {
			fmt.Fprintln(os.Stderr, "kafkatx:", ee.err)
		}
		os.Exit(ee.code)
	case err != nil:
		fmt.Fprintln(os.Stderr, "kafkatx:", err)
		os.Exit(1)
	}
}

// logger builds the stderr logger of a subcommand.
func (g *Globals) logger() *zap.Logger {
	cfg := zap.NewProductionConfig()
	cfg.OutputPaths, cfg.ErrorOutputPaths = []string{"stderr"}, []string{"stderr"}
	_ = cfg.Level.UnmarshalText([]byte(g.LogLevel))
	log, err := cfg.Build()
	if err != nil {
		return zap.NewNop()
	}
	return log
}

// pool connects to --database-url (or the URL in --database-url-file).
func (g *Globals) pool(ctx context.Context) (*pgxpool.Pool, error) {
	if g.DatabaseURLFile != "" {
		u, err := readSecretFile(g.DatabaseURLFile)
		if err != nil {
			return nil, err
		}
		g.DatabaseURL = u
	}
	if g.DatabaseURL == "" {
		return nil, errors.New("no database: pass --database-url or set DATABASE_URL")
	}
	p, err := pgxpool.New(ctx, g.DatabaseURL)
	if err != nil {
		return nil, fmt.Errorf("database: %w", err)
	}
	if err := p.Ping(ctx); err != nil {
		p.Close()
		return nil, fmt.Errorf("database: %w", err)
	}
	return p, nil
}

// requireBrokers returns --brokers or an error saying how to set it.
func (g *Globals) requireBrokers() (string, error) {
	if g.Brokers == "" {
		return "", errors.New("no Kafka: pass --brokers or set KAFKA_BOOTSTRAP_SERVERS")
	}
	return g.Brokers, nil
}
