package canary

import (
	"bytes"
	"context"
	"encoding/base64"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/confluentinc/confluent-kafka-go/v2/kafka"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/kafkatx/kafkatx/internal/testenv"
)

// The canaries: each appears nowhere but where the test puts it.
const (
	dbCanary    = "CANARYdb71x"
	saslCanary  = "CANARYsasl72x"
	tokenCanary = "CANARYtok73x"
	authCanary  = "CANARYauth74x"
	// afPWCanary is an Airflow password (--airflow-password-file).
	afPWCanary = "CANARYafpw75x"
)

// forms are the ways a canary could show: as is, base64 (standard, URL, unpadded, and of a
// Basic credential "user:canary"), URL-encoded.
func forms(c string) []string {
	out := []string{c, url.QueryEscape(c), url.PathEscape(c)}
	for _, s := range []string{c, "kafkatx_dev:" + c, "u:" + c, "kafkatx:" + c} {
		for _, enc := range []*base64.Encoding{base64.StdEncoding, base64.URLEncoding, base64.RawStdEncoding, base64.RawURLEncoding} {
			out = append(out, strings.TrimRight(enc.EncodeToString([]byte(s)), "="))
		}
	}
	return out
}

// leaks reports every canary form found in text.
func leaks(text string) []string {
	var found []string
	for _, c := range []string{dbCanary, saslCanary, tokenCanary, authCanary, afPWCanary} {
		for _, f := range forms(c) {
			if strings.Contains(text, f) {
				found = append(found, f)
			}
		}
	}
	return found
}

// output collects what every scenario printed or served, by name.
type output struct {
	mu sync.Mutex
	by map[string]*bytes.Buffer
}

func (o *output) add(name, text string) {
	o.mu.Lock()
	defer o.mu.Unlock()
	if o.by[name] == nil {
		o.by[name] = &bytes.Buffer{}
	}
	o.by[name].WriteString(text)
}

func (o *output) check(t *testing.T) {
	t.Helper()
	for name, b := range o.by {
		if found := leaks(b.String()); len(found) > 0 {
			i := strings.Index(b.String(), found[0])
			t.Errorf("%s shows %q: …%s…", name, found[0], b.String()[max(0, i-120):min(b.Len(), i+40)])
		}
	}
}

func build(t *testing.T, dir, pkg string) string {
	t.Helper()
	root, err := testenv.RepoRoot()
	if err != nil {
		t.Fatal(err)
	}
	bin := filepath.Join(dir, filepath.Base(pkg))
	// In the package's directory: cmd/... and examples/... are modules of their own.
	cmd := exec.Command("go", "build", "-o", bin, ".")
	cmd.Dir = filepath.Join(root, filepath.FromSlash(pkg))
	if out, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("build %s: %v\n%s", pkg, err, out)
	}
	return bin
}

// withPassword returns dsn with its password set to pw and, when hostport is set, its host.
func withPassword(t *testing.T, dsn, pw, hostport string) string {
	t.Helper()
	u, err := url.Parse(dsn)
	if err != nil {
		t.Fatal(err)
	}
	u.User = url.UserPassword(u.User.Username(), pw)
	if hostport != "" {
		u.Host = hostport
	}
	return u.String()
}

// run runs bin to its end (at most limit, then SIGTERM) and returns stdout and stderr.
func run(t *testing.T, env []string, limit time.Duration, bin string, args ...string) string {
	t.Helper()
	cmd := exec.Command(bin, args...)
	cmd.Env = append(os.Environ(), env...)
	var out bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &out
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	done := make(chan struct{})
	go func() { _ = cmd.Wait(); close(done) }()
	select {
	case <-done:
	case <-time.After(limit):
		_ = cmd.Process.Signal(syscall.SIGTERM)
		select {
		case <-done:
		case <-time.After(30 * time.Second):
			_ = cmd.Process.Kill()
			<-done
		}
	}
	return out.String()
}

func get(addr, path string) string {
	resp, err := http.Get("http://" + addr + path)
	if err != nil {
		return ""
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return string(b)
}

// TestNoCanaryInAnyOutput provokes the failure paths reachable with the dev services —
// PostgreSQL refusing the login and unreachable (kafkatx command and examples/orders, at the
// debug log level), a database URL that does not parse, Kafka refusing the SASL password with
// librdkafka's debug=all (the SASL_SSL listener of `scripts/dev-services up secure` when
// KAFKA_SECURE_BOOTSTRAP_SERVERS is set, else SASL_PLAINTEXT against the plaintext broker),
// Airflow answering 401 and 500 (a stand-in, examples/dagtrigger), an Authorization header
// through httpmw (examples/dagservice) — and finds no canary, nor its base64 or URL-encoded
// form, in stdout, stderr, /metrics, /readyz, dead-letter rows, outbox rows (the .dlq
// headers) or stored responses.
// getAuth is get with a bearer token.
func getAuth(addr, path, token string) string {
	req, _ := http.NewRequest(http.MethodGet, "http://"+addr+path, nil)
	req.Header.Set("Authorization", "Bearer "+token)
	req.Header.Set("Accept", "text/html")
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return ""
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return string(b)
}

func TestNoCanaryInAnyOutput(t *testing.T) {
	dsn := testenv.Database(t)
	brokers := testenv.Brokers(t)
	dir := t.TempDir()
	var bins sync.Map
	var wg sync.WaitGroup
	for _, pkg := range []string{"cmd/kafkatx", "examples/orders", "examples/dagtrigger", "examples/dagservice"} {
		wg.Add(1)
		go func() { defer wg.Done(); bins.Store(pkg, build(t, dir, pkg)) }()
	}
	wg.Wait()
	bin := func(pkg string) string { v, _ := bins.Load(pkg); return v.(string) }
	out := &output{by: map[string]*bytes.Buffer{}}
	debug := []string{"KAFKATX_LOG_LEVEL=debug"}
	wrongPW := withPassword(t, dsn, dbCanary, "")
	downPW := withPassword(t, dsn, dbCanary, "127.0.0.1:1")
	badURL := strings.Replace(withPassword(t, dsn, "x", ""), ":x@", ":p@ss#"+dbCanary+"@", 1)
	urlFile := filepath.Join(dir, "db-url")
	if err := os.WriteFile(urlFile, []byte(wrongPW), 0o600); err != nil {
		t.Fatal(err)
	}
	topic, group := testenv.Topic(t, brokers, 1), testenv.Group(t)

	t.Run("database", func(t *testing.T) {
		for name, u := range map[string]string{"refused login": wrongPW, "unreachable": downPW, "unparsable": badURL} {
			// The services wait up to 60 s for a database not listening yet (pgstart):
			// 15 s of their waiting logs is enough to look at.
			limit := time.Minute
			if name == "unreachable" {
				limit = 15 * time.Second
			}
			out.add("kafkatx offsets status, "+name, run(t, nil, time.Minute, bin("cmd/kafkatx"), "--log-level", "debug",
				"--database-url", u, "--brokers", brokers, "offsets", "status", "--group", group, "--topic", topic))
			out.add("kafkatx relay, "+name, run(t, nil, limit, bin("cmd/kafkatx"), "--log-level", "debug",
				"--database-url", u, "--brokers", brokers, "relay"))
			out.add("kafkatx dlq list (DATABASE_URL), "+name, run(t, []string{"DATABASE_URL=" + u}, time.Minute, bin("cmd/kafkatx"), "--log-level", "debug",
				"--brokers", brokers, "dlq", "list"))
			out.add("orders, "+name, run(t, debug, limit, bin("examples/orders"),
				"--database-url", u, "--brokers", brokers, "--topic", topic, "--group", group, "--exit-when-idle", "2s"))
		}
		out.add("kafkatx --database-url-file, refused login", run(t, nil, time.Minute, bin("cmd/kafkatx"), "--log-level", "debug",
			"--database-url-file", urlFile, "--brokers", brokers, "offsets", "status", "--group", group, "--topic", topic))
	})

	t.Run("sasl", func(t *testing.T) {
		props := fmt.Sprintf("security.protocol=SASL_PLAINTEXT\nsasl.mechanism=PLAIN\nsasl.username=u\nsasl.password=%s\ndebug=all\n", saslCanary)
		kb := brokers
		if sb := os.Getenv(testenv.EnvSecureBootstrap); sb != "" && !testing.Short() { // the short tier has no SASL_SSL listener
			_, p, _ := testenv.SecureKafka(t)
			kb = sb
			props = fmt.Sprintf("security.protocol=%v\nsasl.mechanism=%v\nsasl.username=%v\nsasl.password=%s\nssl.ca.location=%v\ndebug=all\n",
				p["security.protocol"], p["sasl.mechanism"], p["sasl.username"], saslCanary, p["ssl.ca.location"])
		}
		file := filepath.Join(dir, "kafka.properties")
		if err := os.WriteFile(file, []byte(props), 0o600); err != nil {
			t.Fatal(err)
		}
		addr := testenv.FreeAddr(t)
		var served string
		stop := make(chan struct{})
		go func() {
			defer close(stop)
			time.Sleep(10 * time.Second)
			served = get(addr, "/metrics") + get(addr, "/readyz")
		}()
		out.add("orders, SASL refused, debug=all", run(t, debug, 14*time.Second, bin("examples/orders"), "--database-url", dsn, "--brokers", kb,
			"--kafka-config-file", file, "--topic", topic, "--group", group, "--metrics-addr", addr))
		<-stop
		out.add("orders /metrics and /readyz, SASL refused", served)
		out.add("kafkatx offsets status, SASL refused", run(t, nil, time.Minute, bin("cmd/kafkatx"), "--log-level", "debug",
			"--database-url", dsn, "--brokers", kb, "--kafka-config-file", file, "offsets", "status", "--group", group, "--topic", topic))
	})

	t.Run("airflow", func(t *testing.T) {
		var n int
		var mu sync.Mutex
		srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			mu.Lock()
			n++
			odd := n%2 == 1
			mu.Unlock()
			if odd {
				http.Error(w, `{"detail":"Token Expired"}`, http.StatusUnauthorized)
				return
			}
			http.Error(w, `{"detail":"Internal Server Error"}`, http.StatusInternalServerError)
		}))
		defer srv.Close()
		tokenFile := filepath.Join(dir, "token")
		if err := os.WriteFile(tokenFile, []byte(tokenCanary+"\n"), 0o600); err != nil {
			t.Fatal(err)
		}
		at := testenv.Topic(t, brokers, 1)
		testenv.Produce(t, brokers, at, []kafka.Message{{Key: []byte(`{"id":1}`),
			Value: []byte(`{"before":null,"after":{"id":1},"source":{"connector":"postgresql","db":"app","schema":"public","table":"c","lsn":100,"txId":7},"op":"c","ts_ms":1}`)}})
		addr := testenv.FreeAddr(t)
		var served string
		stop := make(chan struct{})
		go func() {
			defer close(stop)
			time.Sleep(8 * time.Second)
			served = get(addr, "/metrics") + get(addr, "/readyz")
		}()
		dg := testenv.Group(t)
		out.add("dagtrigger, Airflow 401 and 500", run(t, debug, 12*time.Second, bin("examples/dagtrigger"), "--database-url", dsn, "--brokers", brokers,
			"--topic", at, "--group", dg, "--airflow-url", srv.URL, "--airflow-token-file", tokenFile, "--dag-id", "d",
			"--max-attempts", "1", "--airflow-wait-max", "1s", "--metrics-addr", addr))
		<-stop
		out.add("dagtrigger /metrics and /readyz", served)

		// The kafkatx command's Airflow flags, with a token file and with a password file:
		// airflow status, a skip's dry run with --clear-airflow (a ledger row below the
		// watermark makes it read Airflow), and the console's Airflow drift (page and API).
		pwFile := filepath.Join(dir, "airflow-password")
		consoleTok := filepath.Join(dir, "console-token")
		for file, text := range map[string]string{pwFile: afPWCanary + "\n", consoleTok: "console-token-0123456789abcdef\n"} {
			if err := os.WriteFile(file, []byte(text), 0o600); err != nil {
				t.Fatal(err)
			}
		}
		lp, err := pgxpool.New(context.Background(), dsn)
		if err != nil {
			t.Fatal(err)
		}
		defer lp.Close()
		if _, err := lp.Exec(context.Background(), `INSERT INTO kafkatx.airflow_ledger (group_id, topic, partition, "offset", idempotency_key, target, dag_id, run_id, outcome)
			VALUES ($1, $2, 0, 0, 'canary', 'dag_run', 'd', 'kafkatx__canary', 'created')`, dg, at); err != nil {
			t.Fatal(err)
		}
		for name, auth := range map[string][]string{"token file": {"--airflow-token-file", tokenFile}, "password file": {"--airflow-username", "u", "--airflow-password-file", pwFile}} {
			base := []string{"--log-level", "debug", "--database-url", dsn, "--brokers", brokers}
			af := append([]string{"--airflow-url", srv.URL}, auth...)
			out.add("kafkatx airflow status, Airflow 401 and 500, "+name, run(t, nil, time.Minute, bin("cmd/kafkatx"),
				append(append(append([]string{}, base...), "airflow", "status", "--group", dg), af...)...))
			out.add("kafkatx offsets reset --clear-airflow, Airflow 401 and 500, "+name, run(t, nil, time.Minute, bin("cmd/kafkatx"),
				append(append(append([]string{}, base...), "offsets", "reset", "--group", dg, "--topic", at, "--to-offset", "1", "--mode", "skip", "--reason", "canary", "--clear-airflow"), af...)...))
			caddr := testenv.FreeAddr(t)
			var pages string
			done := make(chan struct{})
			go func() {
				defer close(done)
				for try := 0; try < 100; try++ {
					if p := getAuth(caddr, "/offsets?group="+dg, "console-token-0123456789abcdef"); p != "" {
						pages = p + getAuth(caddr, "/api/airflow/drift?group="+dg, "console-token-0123456789abcdef")
						return
					}
					time.Sleep(100 * time.Millisecond)
				}
			}()
			out.add("kafkatx console --airflow-url, Airflow 401 and 500, "+name, run(t, nil, 15*time.Second, bin("cmd/kafkatx"),
				append(append(append([]string{}, base...), "console", "--addr", caddr, "--token-file", consoleTok), af...)...))
			<-done
			if !strings.Contains(pages, "airflow-drift") {
				t.Errorf("console with Airflow access, %s: no Airflow drift section in the offsets page:\n%s", name, pages)
			}
			out.add("kafkatx console pages, Airflow 401 and 500, "+name, pages)
		}
	})

	t.Run("httpmw", func(t *testing.T) {
		addr := testenv.FreeAddr(t)
		cmd := exec.Command(bin("examples/dagservice"), "--addr", addr, "--database-url", dsn)
		cmd.Env = append(os.Environ(), debug...)
		var logs bytes.Buffer
		cmd.Stdout, cmd.Stderr = &logs, &logs
		if err := cmd.Start(); err != nil {
			t.Fatal(err)
		}
		defer func() {
			_ = cmd.Process.Signal(syscall.SIGTERM)
			_ = cmd.Wait()
			out.add("dagservice logs", logs.String())
		}()
		basic := "Basic " + base64.StdEncoding.EncodeToString([]byte("u:"+authCanary))
		for _, hdr := range []string{basic, "Bearer " + authCanary} {
			for _, key := range []string{"k-" + fmt.Sprint(len(hdr)), "k-" + fmt.Sprint(len(hdr)), strings.Repeat("x", 300)} {
				var body string
				for try := 0; try < 50; try++ {
					req, _ := http.NewRequest(http.MethodPost, "http://"+addr+"/tasks/score", strings.NewReader(`{"customer":1}`))
					req.Header.Set("Authorization", hdr)
					req.Header.Set("Idempotency-Key", key)
					req.Header.Set("Content-Type", "application/json")
					resp, err := http.DefaultClient.Do(req)
					if err != nil {
						time.Sleep(100 * time.Millisecond) // not listening yet
						continue
					}
					b, _ := io.ReadAll(resp.Body)
					resp.Body.Close()
					var h bytes.Buffer
					_ = resp.Header.Write(&h)
					body = h.String() + string(b)
					break
				}
				out.add("dagservice answers", body)
			}
		}
	})

	// What the runs stored.
	pool, err := pgxpool.New(context.Background(), dsn)
	if err != nil {
		t.Fatal(err)
	}
	defer pool.Close()
	for _, table := range []string{"dead_letters", "outbox", "idempotency_responses", "idempotency_keys", "attempts", "offset_audit"} {
		var text string
		err := pool.QueryRow(context.Background(), `SELECT coalesce(string_agg(t::text, E'\n'), '') FROM kafkatx.`+table+` t`).Scan(&text)
		if err != nil {
			t.Errorf("table %s: %v", table, err)
			continue
		}
		out.add("table kafkatx."+table, text)
	}
	var stored int
	_ = pool.QueryRow(context.Background(), `SELECT count(*) FROM kafkatx.idempotency_responses`).Scan(&stored)
	if stored == 0 {
		t.Errorf("no stored response: the httpmw scenario did not run")
	}
	out.check(t)
	// The canary must have been used: the outputs exist and name the failures.
	for name, want := range map[string]string{
		"kafkatx offsets status, refused login": "password authentication failed",
		"orders, unparsable":                    "percent-encode",
	} {
		if b := out.by[name]; b == nil || !strings.Contains(b.String(), want) {
			t.Errorf("%s: the failure did not happen (no %q)", name, want)
		}
	}
}
