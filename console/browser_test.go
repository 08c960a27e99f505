package console

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/chromedp/cdproto/cdp"
	"github.com/chromedp/cdproto/log"
	"github.com/chromedp/cdproto/runtime"
	"github.com/chromedp/chromedp"

	"github.com/kafkatx/kafkatx/internal/testenv"
)

// chromium finds the headless browser: $CHROMIUM, else chromium on PATH (Debian's package,
// which scripts/install-browser installs and `make test` runs first).
func chromium(t *testing.T) string {
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
	srv := f.server(nil)
	id := f.firstDeadLetter()

	shots := t.TempDir()
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
		chromedp.WindowSize(1500, 950), chromedp.Flag("lang", "en-US"))
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
		png, err := chromedp.Run(ctx, chromedp.FullScreenshot(100))
		if err != nil {
			t.Fatalf("screenshot %s: %v", name, err)
		}
		if err := os.WriteFile(filepath.Join(shots, name+".png"), png, 0o644); err != nil {
			t.Fatal(err)
		}
	}
	// waitText polls until the element sel reads want (a click's navigation takes a moment).
	waitText := func(sel, want string) {
		t.Helper()
		got := ""
		for end := time.Now().Add(20 * time.Second); time.Now().Before(end); time.Sleep(200 * time.Millisecond) {
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
	do("open the console", chromedp.Navigate(srv.URL+"/"), visible("#token"))
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

	mu.Lock()
	defer mu.Unlock()
	if len(pageErrors) > 0 {
		t.Fatalf("the pages raised errors: %s", strings.Join(pageErrors, "; "))
	}
}
