package console

import (
	"context"
	"encoding/base64"
	"fmt"
	"net/http"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/chromedp/cdproto/cdp"
	"github.com/chromedp/cdproto/log"
	"github.com/chromedp/cdproto/runtime"
	"github.com/chromedp/chromedp"
	"github.com/jackc/pgx/v5"

	"github.com/kafkatx/kafkatx/internal/parking"
	"github.com/kafkatx/kafkatx/internal/testenv"
)

// chromium finds the headless browser: $CHROMIUM, else chromium on PATH (Debian's package,
// which scripts/install-browser installs and `make test` runs first).
func chromium(t *testing.T) string {
	t.Helper()
	testenv.FullTier(t, "needs headless Chromium (make browser)")
	for _, p := range []string{os.Getenv("CHROMIUM"), "chromium", "chromium-browser"} {
		if p == "" {
			continue
		}
		if path, err := exec.LookPath(p); err == nil {
			return path
		}
	}
	testenv.Unavailable(t, "no chromium: run scripts/install-browser (Debian's chromium package) or set CHROMIUM")
	return ""
}

// The incident, handled in a real browser (headless Chromium): sign in with the token; see the
// drift an out-of-band offset move left, and its figures refresh without a reload after a
// second move; replay a dead letter after its dry run; see the audit row. No page raises a
// script error or a content-security-policy violation. With KAFKATX_CONSOLE_SCREENSHOTS=1 the
// screenshots of each page are written to docs/console/ (else to a temporary directory).
func TestConsoleInABrowser(t *testing.T) {
	t.Parallel()
	exe := chromium(t)
	f := newFixture(t)
	// A canary secret, which no page and no export may show in any encoding, and samples
	// taken often enough for the charts to draw from this test's own run.
	const canary = `canary<S3cr3t"p@ss/w0rd>`
	srv := f.server(func(c *Config) { c.Secrets = []string{canary}; c.SampleEvery = 300 * time.Millisecond })
	id := f.firstDeadLetter()
	canaryID := f.count(`INSERT INTO %s.dead_letters (group_id, topic, partition, "offset", key, value, header_keys, header_values,
			error_class, error_message, stack, attempts, first_failure_at, last_failure_at)
		VALUES ($1, $2, 9, 1, $3, $4, ARRAY['auth'::bytea, '\x6bff6579'::bytea], ARRAY[$5::bytea, 'v'::bytea], 'permanent', $6, $7, 1, now(), now()) RETURNING id`,
		f.group, f.topic, []byte("key "+canary), []byte("0123456789abc"+canary+" and the value goes on past the line"),
		[]byte(canary), "login refused for Basic "+base64.StdEncoding.EncodeToString([]byte("ops:"+canary)), "dsn postgres://ops:"+url.QueryEscape(canary)+"@db/x")
	seen := 0
	noCanary := func(where, body string) {
		t.Helper()
		seen++
		for _, form := range append(canaryForms(canary), hexDumpPairs(canary[:10]), canary[:10], base64.StdEncoding.EncodeToString([]byte("ops:" + canary))[4:20]) {
			if strings.Contains(body, form) {
				t.Errorf("%s shows the canary secret as %q", where, form)
			}
		}
	}

	shots := t.ArtifactDir() // go test -artifacts -outputdir DIR keeps them for a person to look at
	if os.Getenv("KAFKATX_CONSOLE_SCREENSHOTS") == "1" {
		root, err := testenv.RepoRoot()
		if err != nil {
			t.Fatal(err)
		}
		shots = filepath.Join(root, "docs", "console")
		if err := os.MkdirAll(shots, 0o755); err != nil {
			t.Fatal(err)
		}
	}

	opts := append(chromedp.DefaultExecAllocatorOptions[:], chromedp.ExecPath(exe), chromedp.NoSandbox, chromedp.DisableGPU,
		chromedp.WindowSize(1400, 900), chromedp.Flag("lang", "en-US"))
	actx, cancelA := chromedp.NewExecAllocator(context.Background(), opts...)
	defer cancelA()
	ctx, cancel := chromedp.NewContext(actx)
	defer cancel()
	ctx, cancelT := context.WithTimeout(ctx, 3*time.Minute)
	defer cancelT()

	var mu sync.Mutex
	var pageErrors []string
	if err := chromedp.Listen(ctx, func(ev any) {
		mu.Lock()
		defer mu.Unlock()
		switch e := ev.(type) {
		case *runtime.EventExceptionThrown:
			pageErrors = append(pageErrors, fmt.Sprintf("exception: %s %v", e.ExceptionDetails.Text, e.ExceptionDetails.Exception))
		case *log.EventEntryAdded:
			if e.Entry.Level == log.EntryLevelError {
				pageErrors = append(pageErrors, fmt.Sprintf("console: %s (%v)", e.Entry.Text, e.Entry.URL))
			}
		}
	}); err != nil {
		t.Fatal(err)
	}
	do := func(what string, steps ...chromedp.Action[chromedp.Void]) {
		t.Helper()
		if err := chromedp.Do(ctx, steps...); err != nil {
			t.Fatalf("%s: %v", what, err)
		}
	}
	text := func(sel string) string {
		t.Helper()
		s, err := chromedp.Run(ctx, chromedp.Text(chromedp.CSS(sel)))
		if err != nil {
			t.Fatalf("text of %s: %v", sel, err)
		}
		return strings.TrimSpace(s)
	}
	shot := func(name string) {
		t.Helper()
		fits(ctx, t, name)
		png, err := chromedp.Run(ctx, chromedp.FullScreenshot(100))
		if err != nil {
			t.Fatalf("screenshot %s: %v", name, err)
		}
		if err := os.WriteFile(filepath.Join(shots, name+".png"), png, 0o644); err != nil {
			t.Fatal(err)
		}
		html, err := chromedp.Run(ctx, chromedp.OuterHTML(chromedp.CSS("html")))
		if err != nil {
			t.Fatalf("page of %s: %v", name, err)
		}
		noCanary("the page of "+name, html)
	}
	defer func() { t.Logf("screenshots of %d pages in %s", seen, shots) }()
	// waitText polls until the element sel reads want (a click's navigation takes a moment).
	waitText := func(sel, want string) {
		t.Helper()
		got := ""
		for end := time.Now().Add(60 * time.Second); time.Now().Before(end); time.Sleep(200 * time.Millisecond) {
			if s, err := chromedp.Run(ctx, chromedp.Text(chromedp.CSS(sel), chromedp.AtLeast(0))); err == nil {
				if got = strings.TrimSpace(s); got == want {
					return
				}
			}
		}
		t.Fatalf("%s reads %q, want %q", sel, got, want)
	}
	visible := func(sel string) chromedp.Action[chromedp.Void] { return chromedp.WaitVisible(chromedp.CSS(sel)) }
	click := func(sel string) chromedp.Action[chromedp.Void] { return chromedp.Click(chromedp.CSS(sel)) }
	if _, err := chromedp.Call(ctx, log.Enable, cdp.Empty{}); err != nil {
		t.Fatal(err)
	}

	// Sign in: the console sends a browser without a session to the sign-in page.
	// Every page is seen, checked and photographed in a 1,400 × 900 viewport (fits).
	do("open the console", chromedp.EmulateViewport(1400, 900), chromedp.Navigate(srv.URL+"/"), visible("#token"))
	loc, err := chromedp.Run(ctx, chromedp.Location())
	if err != nil || !strings.HasSuffix(loc, "/signin") {
		t.Fatalf("without a session the console showed %s (%v), want the sign-in page", loc, err)
	}
	shot("signin")
	do("sign in", chromedp.SendKeys(chromedp.CSS("#token"), f.token), chromedp.SendKeys(chromedp.CSS("#name"), "alice"),
		click("#signin-submit"), visible("#partitions"))

	// The drift, with both offsets, highlighted.
	row := fmt.Sprintf(`tr[data-key="%s|%s|0"]`, f.group, f.topic)
	wm, committed, state := text(row+` td[data-f="watermark"]`), text(row+` td[data-f="committed"]`), text(row+` td[data-f="state"]`)
	class, err := chromedp.Run(ctx, chromedp.AttributeValue(chromedp.CSS(row), "class"))
	if err != nil {
		t.Fatal(err)
	}
	shot("partitions")
	if wm != "10" || committed != "15" || state != "kafka_ahead" || !strings.Contains(class.Value, "drift") {
		t.Fatalf("partition row: watermark %q, committed %q, state %q, class %q: want 10, 15, kafka_ahead, drift", wm, committed, state, class.Value)
	}
	// A second out-of-band move shows up without reloading the page (the script refreshes
	// the figures every 5 s from /api/partitions).
	f.moveGroupOffset(12)
	deadline := time.Now().Add(30 * time.Second)
	for committed != "12" {
		if time.Now().After(deadline) {
			t.Fatalf("the committed offset still reads %q 30 s after the move, want 12 without a reload", committed)
		}
		time.Sleep(500 * time.Millisecond)
		committed = text(row + ` td[data-f="committed"]`)
	}
	if drift := text(row + ` td[data-f="drift"]`); drift != "+2" {
		t.Fatalf("drift %q after the refresh, want +2", drift)
	}

	do("offsets page", chromedp.Navigate(srv.URL+"/offsets?group="+f.group), visible("#offset-audit"))
	shot("offsets")
	// Align Kafka to the database through the reset form: the plan first, then the execution.
	do("reset dry run", chromedp.SendKeys(chromedp.CSS(`#reset-form input[name="reason"]`), "undo the manual move"), click("#reset-dry-run"))
	waitText("#reset-result h2", "Dry run: nothing changed")
	shot("offsets-reset-dry-run")
	if c := text(row + ` td[data-f="committed"]`); c != "12" {
		t.Fatalf("committed offset %q after the reset's dry run, want 12", c)
	}
	do("reset", click("#reset-execute"))
	waitText("#reset-result h2", "Applied")
	waitText(row+` td[data-f="committed"]`, "10")
	if a := f.str(`SELECT actor FROM %s.offset_audit WHERE kind = 'align' ORDER BY id DESC LIMIT 1`); !strings.HasPrefix(a, "alice via console") {
		t.Fatalf("align audit actor %q", a)
	}
	do("dead letters page", chromedp.Navigate(srv.URL+"/dead-letters?topic="+f.topic), visible("#fingerprints"))
	shot("dead-letters")

	// Replay one dead letter: the dry run first, which changes nothing.
	do("dead letter page", chromedp.Navigate(fmt.Sprintf("%s/dead-letters/%d", srv.URL, id)), visible("#dl-reason"))
	shot("dead-letter")
	do("dry run", chromedp.SendKeys(chromedp.CSS("#dl-reason"), "decoder fixed in 1.4.2"), click("#dl-dry-run"), visible("#action-result"))
	shot("replay-dry-run")
	if title := text("#result-title"); title != "Dry run: nothing changed" {
		t.Fatalf("after the dry run the page says %q", title)
	}
	if st := f.str(`SELECT status FROM %s.dead_letters WHERE id = $1`, id); st != "new" || f.count(`SELECT count(*) FROM %s.dlq_audit`) != 0 {
		t.Fatalf("the dry run changed dead letter %d (%s)", id, st)
	}
	do("execute", click("#execute"))
	waitText("#result-title", "Done")
	if st := f.str(`SELECT status FROM %s.dead_letters WHERE id = $1`, id); st != "replayed" {
		t.Fatalf("dead letter %d is %s after the replay", id, st)
	}
	// The audit row, on the dead letter's page.
	do("see the audit row", click("#back"))
	waitText("#dl-status", "replayed")
	audit, status := text("#dl-audit tbody"), text("#dl-status")
	shot("dead-letter-replayed")
	if status != "replayed" || !strings.Contains(audit, "replay") || !strings.Contains(audit, "alice via console") || !strings.Contains(audit, "decoder fixed in 1.4.2") {
		t.Fatalf("dead letter page: status %q, audit %q", status, audit)
	}
	// A row the relay parked, released from the outbox page after its dry run.
	parked := f.count(`INSERT INTO %s.outbox (topic, key, value) VALUES ($1, 'k', 'v') RETURNING id`, f.topic)
	f.count(`WITH u AS (UPDATE %s.outbox SET state = 'parked', parked_at = now(), attempts = 1,
		last_error = 'Broker: Message size too large' WHERE id = $1 RETURNING 1) SELECT count(*) FROM u`, parked)
	do("outbox page", chromedp.Navigate(srv.URL+"/outbox"), visible("#backlog"))
	if p := text("#parked tbody"); !strings.Contains(p, "Message size too large") {
		t.Fatalf("parked rows: %q", p)
	}
	shot("outbox")
	do("release dry run", click(`#parked input[type="checkbox"]`), chromedp.SendKeys(chromedp.CSS(`#parked-action input[name="reason"]`), "max.message.bytes raised"),
		click(`#parked-action button`))
	waitText("#result-title", "Dry run: nothing changed")
	if st := f.str(`SELECT state FROM %s.outbox WHERE id = $1`, parked); st != "parked" {
		t.Fatalf("the release's dry run left the row %s", st)
	}
	do("release", click("#execute"))
	waitText("#result-title", "Done")
	if st := f.str(`SELECT state FROM %s.outbox WHERE id = $1`, parked); st != "pending" {
		t.Fatalf("the released row is %s", st)
	}

	// A parked key (issue 45) with a long key and a long error: the read-only parked keys page
	// fits the viewport like every page.
	long := strings.Repeat("tenant-7-order-", 12)
	ptx := mustBegin(t, f)
	if err := parking.New(f.schema).ParkTx(context.Background(), ptx, parking.Message{Group: f.group, Topic: f.topic, Partition: 0, Offset: 1,
		KeyHash: parking.KeyHash([]byte(long), 1), Key: []byte(long), Value: []byte("v"), Attempts: 2, ErrorClass: "handler",
		LastError: strings.Repeat("the tenant's service answered 503 Service Unavailable; ", 6), NextTry: time.Now().Add(time.Hour)}); err != nil {
		t.Fatal(err)
	}
	if err := ptx.Commit(context.Background()); err != nil {
		t.Fatal(err)
	}
	do("parked keys page", chromedp.Navigate(srv.URL+"/parked-keys?group="+f.group), visible("#parked-keys"))
	if p := text("#parked-keys tbody"); !strings.Contains(p, "503 Service Unavailable") {
		t.Fatalf("parked keys: %q", p)
	}
	shot("parked-keys")

	// The canary dead letter: its hex dump, headers (one key not UTF-8, shown as its bytes)
	// and error, with the secret masked everywhere.
	do("canary dead letter", chromedp.Navigate(fmt.Sprintf("%s/dead-letters/%d", srv.URL, canaryID)), visible("#dl-reason"))
	shot("dead-letter-canary")
	if page, _ := chromedp.Run(ctx, chromedp.Text(chromedp.CSS("main"))); !strings.Contains(page, `k\xffey`) || !strings.Contains(page, "***") {
		t.Errorf("the canary dead letter's page shows no masked value or no escaped header key:\n%s", page)
	}
	for _, format := range []string{"json", "csv"} {
		code, body := call(t, http.DefaultClient, "GET", srv.URL+"/api/dead-letters/export?format="+format+"&topic="+f.topic, f.token, "")
		if code != 200 || !strings.Contains(body, strconv.FormatInt(canaryID, 10)) {
			t.Fatalf("export %s: %d %.300s", format, code, body)
		}
		noCanary("the "+format+" export", body)
	}
	for _, api := range []string{"/api/dead-letters?topic=" + f.topic, fmt.Sprintf("/api/dead-letters/%d", canaryID), "/api/dead-letters/groups?topic=" + f.topic, "/api/partitions"} {
		_, body := call(t, http.DefaultClient, "GET", srv.URL+api, f.token, "")
		noCanary(api, body)
	}

	// An unexplained skip: Kafka's committed offset moved past the watermark with Kafka's own
	// tool, and the consumer, following it, audits the skipped range. The partitions page
	// highlights the row and counts it at the top; its chart draws from the samples.
	f.moveGroupOffset(13)
	f.runConsumer(func() bool {
		return f.count(`SELECT count(*) FROM %s.offset_audit WHERE kind = 'unexplained_skip' AND group_id = $1`, f.group) > 0
	})
	time.Sleep(time.Second) // a few more samples, the consumer's progress among them
	do("partitions after the skip", chromedp.Navigate(srv.URL+"/"), visible("#partitions"))
	class, err = chromedp.Run(ctx, chromedp.AttributeValue(chromedp.CSS(row), "class"))
	if err != nil {
		t.Fatal(err)
	}
	note, count := text(row+" .attention-note"), text("#attention-count")
	// The consumer has caught up: a low lag, whose chart must still show its baseline and
	// value (fits checks every chart of the page in shot below).
	if lag, err := strconv.Atoi(text(row + ` td[data-f="lag"]`)); err != nil || lag > 3 {
		t.Fatalf("lag %d (%v) after the consumer caught up, want 0 to 3 for the low-lag chart check", lag, err)
	}
	points, err := chromedp.Run(ctx, chromedp.AttributeValue(chromedp.CSS(row+" svg.chart polyline.lag"), "points"))
	if err != nil {
		t.Fatalf("no lag chart on the row: %v", err)
	}
	shot("partitions-unexplained-skip")
	if !strings.Contains(class.Value, "attention") || !strings.Contains(note, "unexplained_skip") || count == "0" {
		t.Fatalf("after an unexplained skip: row class %q, note %q, count %q: want it highlighted and counted", class.Value, note, count)
	}
	if n := len(strings.Fields(points.Value)); n < 2 {
		t.Fatalf("the lag chart has %d points (%q), want a line from the samples", n, points.Value)
	}
	do("offsets page with the charts", chromedp.Navigate(srv.URL+"/offsets?group="+f.group), visible("#offset-audit"))
	shot("offsets-charts")

	// Search over 100,000 dead letters: one rare text among them, found by the page.
	seedDeadLetters(t, f.pool, f.schema, 100_000)
	start := time.Now()
	do("search 100,000 dead letters", chromedp.Navigate(srv.URL+"/dead-letters?q=needle-50000"), visible("#dead-letters"))
	took := time.Since(start)
	found := text("#dead-letters tbody")
	shot("dead-letters-search")
	t.Logf("the dead-letter page searched 100,000 dead letters for a rare text in %v", took)
	if !strings.Contains(found, "needle-50000") {
		t.Fatalf("search for needle-50000: %q", found)
	}

	mu.Lock()
	defer mu.Unlock()
	if len(pageErrors) > 0 {
		t.Fatalf("the pages raised errors: %s", strings.Join(pageErrors, "; "))
	}
}

// mustBegin begins a transaction on f's pool (t.Cleanup rolls it back if it is left open).
func mustBegin(t *testing.T, f *fixture) pgx.Tx {
	t.Helper()
	tx, err := f.pool.Begin(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = tx.Rollback(context.Background()) })
	return tx
}

// layoutJS measures the page for fits: the document's widths and, for every lag chart, its
// box, the boxes of the ancestors that clip it, and what it shows.
const layoutJS = `(() => {
  const d = document.documentElement;
  const box = (e) => { const r = e.getBoundingClientRect(); return {left: r.left, right: r.right, top: r.top, bottom: r.bottom}; };
  const charts = [...document.querySelectorAll("td.chart svg.chart")].map((svg) => {
    const clips = [];
    for (let a = svg.parentElement; a && a !== d; a = a.parentElement) {
      if (getComputedStyle(a).overflowX !== "visible") clips.push(box(a));
    }
    const texts = [...svg.querySelectorAll("text")].filter((t) => t.getBBox().width > 0).map((t) => t.textContent);
    const base = svg.querySelector(".axis");
    const lag = svg.querySelector(".lag");
    const lb = lag ? lag.getBBox() : null;
    return {box: box(svg), clips, label: svg.getAttribute("aria-label") || "", texts,
      baseline: !!base && base.getBBox().width > 0,
      mark: !!lb && (lb.width > 0 || lb.height > 0)};
  });
  return {scrollWidth: d.scrollWidth, clientWidth: d.clientWidth, charts};
})()`

type layoutBox struct{ Left, Right, Top, Bottom float64 }

type layout struct {
	ScrollWidth, ClientWidth float64
	Charts                   []struct {
		Box      layoutBox
		Clips    []layoutBox
		Label    string
		Texts    []string
		Baseline bool
		Mark     bool
	}
}

// fits checks the page in the browser's viewport (1,400 px wide): no horizontal overflow of
// the document (a table may scroll in its own container), every lag chart wholly inside the
// viewport and inside every container that clips it, and showing a baseline, a mark for the
// lag and, as text, the lag it names in its label (a chart at lag 0 is not an empty box).
func fits(ctx context.Context, t *testing.T, page string) {
	t.Helper()
	l, err := chromedp.Run(ctx, chromedp.Evaluate[layout](layoutJS))
	if err != nil {
		t.Fatalf("measure the page %s: %v", page, err)
	}
	if l.ScrollWidth > l.ClientWidth {
		t.Errorf("page %s: the document is %.0f px wide in a %.0f px viewport (horizontal overflow)", page, l.ScrollWidth, l.ClientWidth)
	}
	for i, c := range l.Charts {
		if c.Box.Left < 0 || c.Box.Right > l.ClientWidth {
			t.Errorf("page %s, chart %d: spans %.0f to %.0f px, outside the %.0f px viewport", page, i, c.Box.Left, c.Box.Right, l.ClientWidth)
		}
		for _, k := range c.Clips {
			if c.Box.Left < k.Left || c.Box.Right > k.Right {
				t.Errorf("page %s, chart %d: spans %.0f to %.0f px, cut by its container (%.0f to %.0f px)", page, i, c.Box.Left, c.Box.Right, k.Left, k.Right)
			}
		}
		if c.Label == "no samples yet" {
			continue
		}
		lag, _, _ := strings.Cut(strings.TrimPrefix(c.Label, "lag "), " ")
		shown := false
		for _, s := range c.Texts {
			shown = shown || strings.Contains(s+" ", "lag "+lag+" ")
		}
		if !c.Baseline || !c.Mark || !shown {
			t.Errorf("page %s, chart %d (%q): baseline %v, lag mark %v, visible texts %q: want a baseline, the line and the text \"lag %s\"",
				page, i, c.Label, c.Baseline, c.Mark, c.Texts, lag)
		}
	}
}
