// Command kafkatx is kafkatx's operator and sidecar binary: migrations, the outbox relay,
// dead-letter tooling and offset repairs. Every subcommand takes --database-url, --brokers
// and --schema, falling back to DATABASE_URL and KAFKA_BOOTSTRAP_SERVERS.
package main

import (
	"context"
	"errors"
	"fmt"
	"net"
	"os"
	"os/signal"
	"strings"
	"syscall"
	"time"

	"github.com/alecthomas/kong"
	"github.com/jackc/pgx/v5/pgxpool"
	"go.uber.org/zap"

	"github.com/kafkatx/kafkatx/cmd/flagcheck"
	"github.com/kafkatx/kafkatx/cmd/logging"
	"github.com/kafkatx/kafkatx/internal/pgerr"
	"github.com/kafkatx/kafkatx/pg"
	"github.com/kafkatx/kafkatx/pgstart"
)

// Globals are the flags every subcommand takes.
type Globals struct {
	DatabaseURL  string        `name:"database-url" env:"DATABASE_URL" help:"PostgreSQL URL (postgres://user:pass@host:port/db)."`
	Brokers      string        `name:"brokers" env:"KAFKA_BOOTSTRAP_SERVERS" help:"Kafka bootstrap servers, host:port[,host:port]."`
	Schema       string        `name:"schema" default:"${default_schema}" help:"Schema of kafkatx's tables."`
	LogLevel     string        `name:"log-level" default:"info" enum:"debug,info,warn,error" help:"Log level (logs go to stderr)."`
	KafkaTimeout time.Duration `name:"kafka-timeout" default:"10s" help:"The offsets commands fail when no broker of --brokers answers within this (1s to 5m)."`

	SessionDatabaseURL string `name:"session-database-url" env:"KAFKATX_SESSION_DATABASE_URL" help:"PostgreSQL URL for what needs a session across transactions (migrations' lock, the relay's leadership lock and LISTEN) when --database-url goes through a transaction pooler such as PgBouncer in transaction mode (default: --database-url)."`

	DatabaseURLFile  string   `name:"database-url-file" env:"KAFKATX_DATABASE_URL_FILE" type:"path" help:"Read the PostgreSQL URL from this file (overrides --database-url; keeps the password out of the environment and the process list)."`
	KafkaConfigFile  string   `name:"kafka-config-file" env:"KAFKATX_KAFKA_CONFIG_FILE" type:"path" help:"librdkafka properties file, one key=value per line (# comments): security.protocol, sasl.*, ssl.*, ... May hold secrets; values are never logged."`
	KafkaConfig      []string `name:"kafka-config" short:"X" sep:"none" help:"librdkafka property key=value (repeatable; after --kafka-config-file). Put secrets in files, not here."`
	SecurityProtocol string   `name:"security-protocol" env:"KAFKATX_SECURITY_PROTOCOL" help:"security.protocol: plaintext, ssl, sasl_plaintext or sasl_ssl."`
	SASLMechanism    string   `name:"sasl-mechanism" env:"KAFKATX_SASL_MECHANISM" help:"sasl.mechanism: PLAIN, SCRAM-SHA-256, SCRAM-SHA-512 or OAUTHBEARER."`
	SASLUsername     string   `name:"sasl-username" env:"KAFKATX_SASL_USERNAME" help:"sasl.username."`
	SASLPasswordFile string   `name:"sasl-password-file" env:"KAFKATX_SASL_PASSWORD_FILE" type:"path" help:"Read sasl.password from this file (trailing newline dropped)."`

	Shard []string `name:"shard" sep:"none" help:"A shard, NAME=URL (repeatable, in order; the first takes unmapped partitions): with it, --database-url names the shard directory's database and each partition's state is read on its shard (kafkatx shards)."`
}

// CLI is the whole command line. Each subcommand lives in its own file.
type CLI struct {
	Globals

	Migrate    MigrateCmd    `cmd:"" help:"Apply or print kafkatx's schema migrations."`
	Offsets    OffsetsCmd    `cmd:"" help:"Offsets: the database leads, Kafka follows (status, reset, audit, account)."`
	Relay      RelayCmd      `cmd:"" help:"Publish the outbox to Kafka (the sidecar): leader election, NOTIFY wake-up, health endpoint."`
	Outbox     OutboxCmd     `cmd:"" help:"Parked outbox rows: list, release, discard."`
	DLQ        DLQCmd        `cmd:"" name:"dlq" help:"Dead letters: list, show, replay through the outbox, discard (audited)."`
	ParkedKeys ParkedKeysCmd `cmd:"" name:"parked-keys" help:"A consumer group's parked keys (Config.Park): list, release, dead-letter (audited)."`
	Airflow    AirflowCmd    `cmd:"" help:"The Airflow ledger against Airflow: status (missing, queued, failed runs and asset events) and repair."`
	Shards     ShardsCmd     `cmd:"" help:"The shard directory (with --shard NAME=URL ...): status, assign a partition to a shard, move it to another (or cancel a move)."`
	Console    ConsoleCmd    `cmd:"" help:"Serve the operator console: web UI and JSON API (partitions, dead letters, outbox, offsets), behind a token."`
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

// Validate checks the flags every subcommand shares (kong calls it after parsing).
func (c *CLI) Validate() error {
	if err := flagcheck.Duration("kafka-timeout", c.KafkaTimeout, time.Second, 5*time.Minute); err != nil {
		return err
	}
	for _, kv := range c.KafkaConfig {
		if err := flagcheck.KeyValue("kafka-config (-X)", kv); err != nil {
			return err
		}
	}
	switch strings.ToLower(c.SecurityProtocol) {
	case "", "plaintext", "ssl", "sasl_plaintext", "sasl_ssl":
	default:
		return fmt.Errorf("--security-protocol %q: want plaintext, ssl, sasl_plaintext or sasl_ssl", c.SecurityProtocol)
	}
	// librdkafka checks the mechanism only under a SASL protocol, and then names the value.
	switch strings.ToUpper(c.SASLMechanism) {
	case "", "PLAIN", "SCRAM-SHA-256", "SCRAM-SHA-512", "OAUTHBEARER", "GSSAPI":
	default:
		return errors.New("--sasl-mechanism: want PLAIN, SCRAM-SHA-256, SCRAM-SHA-512, OAUTHBEARER or GSSAPI")
	}
	return flagcheck.Schema("schema", c.Schema)
}

// nameRules are the rules of the flags that name something, whichever subcommand has them:
// a value given on the command line is checked before anything connects.
var nameRules = map[string]func(name, v string) error{
	"group":       flagcheck.Group,
	"topic":       flagcheck.Topic,
	"to-topic":    flagcheck.Topic,
	"health-addr": flagcheck.Addr,
	"addr":        flagcheck.Addr,
	"error-class": func(name, v string) error {
		return flagcheck.NonEmpty(name, v, "an error class (permanent, max_attempts, panic, ...)")
	},
}

// filterRules override nameRules in the commands whose flag selects rows kafkatx's tables
// hold, by command path prefix: `outbox ...` and `dlq ...` --topic select rows by the topic
// they name, which plain SQL may have set to any text (listed by --all's plan under it), so
// flagcheck.TopicFilter; a topic to publish to (dlq replay --to-topic) or to ask Kafka about
// (offsets ... --topic) keeps Kafka's rule.
var filterRules = map[string]map[string]func(name, v string) error{
	"outbox ": {"topic": flagcheck.TopicFilter},
	"dlq ":    {"topic": flagcheck.TopicFilter},
}

// ruleFor returns the rule of flag in command (kong's command path, such as
// "outbox release <id>"): filterRules' when one applies, else nameRules'.
func ruleFor(command, flag string) func(name, v string) error {
	for prefix, rules := range filterRules {
		if rule := rules[flag]; rule != nil && strings.HasPrefix(command+" ", prefix) {
			return rule
		}
	}
	return nameRules[flag]
}

// checkGiven applies nameRules to the string flags given on the command line and refuses a
// negative duration given to any flag (each flag's own range is its command's Validate).
func checkGiven(kctx *kong.Context) error {
	for _, p := range kctx.Path {
		f := p.Flag
		if f == nil {
			continue
		}
		switch v := kctx.FlagValue(f).(type) {
		case string:
			if rule := ruleFor(kctx.Command(), f.Name); rule != nil {
				if err := rule(f.Name, v); err != nil {
					return err
				}
			}
		case time.Duration:
			if v < 0 {
				return fmt.Errorf("--%s %v: a duration must not be negative", f.Name, v)
			}
		}
	}
	return nil
}

// errLine is err's message as the command prints it on stderr: as is, or, when it holds a
// character termText escapes other than a backslash (an error may quote a consumer group, a
// member's client id or a database message), all of it as termText writes it.
//
// pgconn lays a connection failure out over several lines ("failed to connect to …:\n\t
// hostname resolving error: …"); those line breaks are folded to "; " first, so such an error
// prints as one readable line rather than quoted whole.
func errLine(err error) string {
	msg := strings.ReplaceAll(err.Error(), ":\n\t", ": ")
	msg = strings.ReplaceAll(msg, "\n\t", "; ")
	if bare := strings.ReplaceAll(msg, `\`, ""); termText(bare) == bare {
		return msg
	}
	return termText(msg)
}

// shellQuote returns s as one shell word (flagcheck.Quote), for commands suggested in hints.
func shellQuote(s string) string { return flagcheck.Quote(s) }

func main() {
	var cli CLI
	parser, err := kong.New(&cli,
		kong.Name("kafkatx"),
		kong.Description("Operate kafkatx: migrations, the outbox relay sidecar, dead letters and offsets.\n\n"+exitStatusHelp()),
		cliVars(),
	)
	if err != nil {
		panic(err) // the CLI struct itself is wrong: a programming error
	}
	kctx, err := parser.Parse(flagcheck.JoinNegative(os.Args[1:]))
	if err == nil {
		err = checkGiven(kctx)
	}
	if err == nil {
		err = cli.Globals.checkKafkaSettings()
	}
	if err == nil {
		err = cli.Globals.checkDatabaseURLs()
	}
	if err == nil {
		err = checkShardAware(kctx.Command(), cli.Globals.Shard)
	}
	if err != nil {
		// One line and where to read more, not the whole help.
		cmd := ""
		var pe *kong.ParseError
		switch {
		case errors.As(err, &pe) && pe.Context != nil:
			cmd = pe.Context.Command()
		case kctx != nil:
			cmd = kctx.Command()
		}
		var words []string // the command path without its arguments (<id>, [<id>])
		for _, w := range strings.Fields(cmd) {
			if !strings.HasPrefix(w, "<") && !strings.HasPrefix(w, "[") {
				words = append(words, w)
			}
		}
		help := strings.Join(append([]string{"kafkatx"}, append(words, "--help")...), " ")
		fmt.Fprintf(os.Stderr, "kafkatx: %s (see %s)\n", errLine(err), help)
		os.Exit(exitUsage)
	}
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGTERM, syscall.SIGINT)
	kctx.BindTo(ctx, (*context.Context)(nil)) // commands take the interface type
	err = kctx.Run(&cli.Globals)
	stop()
	var ee *exitError
	switch {
	case errors.As(err, &ee):
		if ee.err != nil {
			fmt.Fprintln(os.Stderr, "kafkatx:", errLine(ee.err))
		}
		os.Exit(ee.code)
	case err != nil:
		fmt.Fprintln(os.Stderr, "kafkatx:", errLine(err))
		if hint := conditionHint(err); hint != "" {
			fmt.Fprintln(os.Stderr, "kafkatx:", hint)
		}
		if errors.Is(err, pg.ErrTransactionPooled) {
			fmt.Fprintln(os.Stderr, "kafkatx:", sessionHint)
		}
		os.Exit(exitFailed)
	}
}

// checkDatabaseURLs refuses, before anything connects (exit 2), an unreadable
// --database-url-file (as --sasl-password-file's) and a --database-url (or the file's URL) or
// --session-database-url that does not parse (flagcheck.DatabaseURL: a bad sslmode,
// default_query_exec_mode, pool_max_conns or port, an unclosed [host]); the message never
// quotes the URL. They were exit 1 after a connection was tried.
func (g *Globals) checkDatabaseURLs() error {
	url, name := g.DatabaseURL, "database-url"
	if g.DatabaseURLFile != "" {
		u, err := readSecretFile(g.DatabaseURLFile)
		if err != nil {
			return fmt.Errorf("--database-url-file: %w", err)
		}
		url, name = u, "database-url-file"
	}
	_, serr := g.shardURLs()
	return flagcheck.First(flagcheck.DatabaseURL(name, url), flagcheck.DatabaseURL("session-database-url", g.SessionDatabaseURL), serr)
}

// sessionHint is the remedy printed under a refusal wrapping pg.ErrTransactionPooled.
const sessionHint = "pass --session-database-url (or KAFKATX_SESSION_DATABASE_URL) with a URL that reaches PostgreSQL directly or through a session pooler, " +
	"for the migrations' lock, the relay's leadership and LISTEN; --database-url may stay on the transaction pooler"

// conditionHint names the database's own condition behind err (internal/pgerr's Server class,
// docs/failures.md), or returns "": the command did nothing wrong and can be run again once
// the condition ends.
//
// A login the server refuses (SQLSTATE class 28: a wrong password, no such role, pg_hba) or a
// database that does not exist (3D000) is the same class for a consumer — no message's doing —
// but does not end by itself: the hint says to check the connection settings instead.
func conditionHint(err error) string {
	c := pgerr.Describe(err)
	var dns *net.DNSError
	switch {
	case c.Class != pgerr.Server:
		return ""
	case errors.As(err, &dns) && dns.IsNotFound:
		return "the database's host name does not resolve (no such host): check the host in --database-url (or in a --shard URL); the command did nothing"
	case strings.HasPrefix(c.SQLState, "28") || c.SQLState == "3D000":
		return fmt.Sprintf("the database refused the connection (%s): check --database-url (user, password, database name) or the server's pg_hba.conf; the command did nothing", c)
	}
	return fmt.Sprintf("this is the database's own condition (%s), not the command's: run it again when it ends", c)
}

// logger builds the stderr logger of a subcommand: console lines on a terminal, JSON
// otherwise (package logging; KAFKATX_LOG_FORMAT decides instead).
func (g *Globals) logger() *zap.Logger { return logging.Must(g.LogLevel) }

// pool connects to --database-url (or the URL in --database-url-file).
func (g *Globals) pool(ctx context.Context) (*pgxpool.Pool, error) {
	return g.openPool(ctx, nil)
}

// servicePool is pool for a long-running command (relay): a server that is not ready yet
// (starting up, in recovery, being promoted: 57P03; not listening) is waited for, for
// pgstart.Within, logged on log; one-shot commands fail at once instead.
func (g *Globals) servicePool(ctx context.Context, log *zap.Logger) (*pgxpool.Pool, error) {
	return g.openPool(ctx, log)
}

// openPool is pool, waiting for the server first when log is set (servicePool).
func (g *Globals) openPool(ctx context.Context, log *zap.Logger) (*pgxpool.Pool, error) {
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
	if log != nil {
		first, err := pg.ParseConfig(g.DatabaseURL)
		if err != nil {
			return nil, fmt.Errorf("database: %w", err)
		}
		if err := pgstart.Await(ctx, first.ConnConfig, pgstart.Within, log); err != nil {
			return nil, fmt.Errorf("database: %w", err)
		}
	}
	// Through a transaction pooler: pgx's QueryExecModeExec (no named prepared statements).
	cfg, _, err := pg.ParsePoolConfig(ctx, g.DatabaseURL)
	if err != nil {
		return nil, fmt.Errorf("database: %w", err)
	}
	p, err := pgxpool.NewWithConfig(ctx, cfg)
	if err != nil {
		return nil, fmt.Errorf("database: %w", err)
	}
	if err := p.Ping(ctx); err != nil {
		p.Close()
		return nil, fmt.Errorf("database: %w", err)
	}
	return p, nil
}

// sessionPool connects to --session-database-url for what needs a session (migrations'
// lock, relay leadership); without it, it returns pool. close closes what it opened.
func (g *Globals) sessionPool(ctx context.Context, pool *pgxpool.Pool) (sp *pgxpool.Pool, closeFn func(), err error) {
	if g.SessionDatabaseURL == "" || g.SessionDatabaseURL == g.DatabaseURL {
		return pool, func() {}, nil
	}
	cfg, err := pg.ParseConfig(g.SessionDatabaseURL)
	if err != nil {
		return nil, nil, fmt.Errorf("--session-database-url: %w", err)
	}
	cfg.MaxConns = 4
	sp, err = pgxpool.NewWithConfig(ctx, cfg)
	if err != nil {
		return nil, nil, fmt.Errorf("--session-database-url: %w", err)
	}
	return sp, sp.Close, nil
}

// requireBrokers returns --brokers or an error saying how to set it.
func (g *Globals) requireBrokers() (string, error) {
	if g.Brokers == "" {
		return "", errors.New("no Kafka: pass --brokers or set KAFKA_BOOTSTRAP_SERVERS")
	}
	return g.Brokers, nil
}
