package console

import (
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"strings"
	"testing"
	"time"
)

// Without the token nothing answers with data: API calls 401, pages redirect to the sign-in
// page, a wrong token 401; a session opened on /signin is HttpOnly and SameSite=Strict, its
// state-changing requests need the CSRF token, and it ends when the token file changes.
func TestAuthTokenSessionAndCSRF(t *testing.T) {
	t.Parallel()
	f := newFixture(t)
	srv := f.server(nil)
	id := f.firstDeadLetter()
	anon := []struct{ method, path string }{
		{"GET", "/"}, {"GET", "/api/partitions"}, {"GET", "/api/dead-letters?topic=" + f.topic}, {"GET", "/api/outbox"},
		{"GET", fmt.Sprintf("/api/dead-letters/%d", id)}, {"GET", "/dead-letters"}, {"GET", "/outbox"},
		{"GET", "/offsets?group=" + f.group}, {"POST", fmt.Sprintf("/api/dead-letters/%d/replay", id)},
	}
	for _, a := range anon {
		for _, tok := range []string{"", "wrong-" + f.token} {
			code, body := call(t, nil, a.method, srv.URL+a.path, tok, `{"reason":"x"}`)
			switch {
			case strings.HasPrefix(a.path, "/api/") || a.method == "POST" || tok != "":
				if code != http.StatusUnauthorized {
					t.Errorf("%s %s (token %q): %d, want 401", a.method, a.path, tok, code)
				}
			default:
				if code != http.StatusSeeOther {
					t.Errorf("%s %s without a token: %d, want 303 to the sign-in page", a.method, a.path, code)
				}
			}
			if strings.Contains(body, f.topic) || strings.Contains(body, f.group) {
				t.Errorf("%s %s without the right token leaked the topic or group: %.200s", a.method, a.path, body)
			}
		}
	}
	// The public prefixes do not open the rest through dot segments.
	for _, p := range []string{"/static/../api/partitions", "/static/%2e%2e/api/partitions", "/signin/../api/partitions"} {
		req, _ := http.NewRequest("GET", srv.URL+p, nil)
		req.URL.RawPath, req.URL.Opaque = "", "//"+strings.TrimPrefix(srv.URL, "http://")+p // sent as is, not cleaned by the client
		resp, err := noRedirect().Do(req)
		if err != nil {
			t.Fatal(err)
		}
		b, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		if resp.StatusCode == 200 || strings.Contains(string(b), f.topic) {
			t.Fatalf("GET %s without a token: %d %.200s", p, resp.StatusCode, b)
		}
	}
	if code, body := call(t, nil, "GET", srv.URL+"/signin", "", ""); code != 200 || !strings.Contains(body, `name="token"`) {
		t.Fatalf("sign-in page: %d %.200s", code, body)
	}
	if st := f.str(`SELECT status FROM %s.dead_letters WHERE id = $1`, id); st != "new" {
		t.Fatalf("dead letter %d is %s after unauthenticated requests", id, st)
	}

	// A wrong token at sign-in opens nothing.
	resp, err := noRedirect().PostForm(srv.URL+"/signin", url.Values{"token": {"wrong-" + f.token}})
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusUnauthorized || len(resp.Cookies()) != 0 {
		t.Fatalf("sign-in with a wrong token: %d, cookies %v", resp.StatusCode, resp.Cookies())
	}
	resp, err = noRedirect().PostForm(srv.URL+"/signin", url.Values{"token": {f.token}})
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if len(resp.Cookies()) != 1 {
		t.Fatalf("sign-in set %d cookies", len(resp.Cookies()))
	}
	if ck := resp.Cookies()[0]; !ck.HttpOnly || ck.SameSite != http.SameSiteStrictMode {
		t.Fatalf("session cookie %+v: want HttpOnly and SameSite=Strict", ck)
	}
	if csp := resp.Header.Get("Content-Security-Policy"); !strings.Contains(csp, "script-src 'self'") || strings.Contains(csp, "unsafe-inline") {
		t.Fatalf("CSP %q", csp)
	}

	c, csrf := signIn(t, srv, f.token)
	if code, body := call(t, c, "GET", srv.URL+"/", "", ""); code != 200 || !strings.Contains(body, f.topic) {
		t.Fatalf("GET / in a session: %d, topic shown: %v", code, strings.Contains(body, f.topic))
	}
	if strings.Contains(call2(t, c, srv.URL+"/"), "<script>") {
		t.Fatal("the page holds an inline script")
	}
	// A session's action without the CSRF token (or with another) is refused; nothing changes.
	replay := fmt.Sprintf("%s/api/dead-letters/%d/replay", srv.URL, id)
	for _, tok := range []string{"", "forged"} {
		hdr := []string{}
		if tok != "" {
			hdr = []string{"X-CSRF-Token", tok}
		}
		if code, _ := call(t, c, "POST", replay, "", `{"reason":"csrf check"}`, hdr...); code != http.StatusForbidden {
			t.Fatalf("session replay with CSRF token %q: %d, want 403", tok, code)
		}
	}
	// From another origin, even with the token: refused, saying so (issue 36: not "missing
	// or wrong CSRF token", which sends the operator after the wrong cause).
	if code, body := call(t, c, "POST", replay, "", `{"reason":"csrf check"}`, "X-CSRF-Token", csrf, "Origin", "https://evil.example"); code != http.StatusForbidden ||
		!strings.Contains(body, "another site (Origin https://evil.example)") || strings.Contains(body, "CSRF token") {
		t.Fatalf("session replay from another origin: %d %s, want 403 naming the origin", code, body)
	}
	if n := f.count(`SELECT count(*) FROM %s.dlq_audit`); n != 0 {
		t.Fatalf("%d audit rows after refused requests", n)
	}
	// A body over MaxBodyBytes is refused before it is read in full.
	big := `{"reason":"` + strings.Repeat("x", MaxBodyBytes) + `"}`
	if code, body := call(t, nil, "POST", replay, f.token, big); code != http.StatusBadRequest || !strings.Contains(body, "too large") {
		t.Fatalf("a %d-byte body: %d %.200s, want 400", len(big), code, body)
	}
	if code, body := call(t, c, "POST", replay, "", `{"reason":"csrf check","dry_run":true}`, "X-CSRF-Token", csrf); code != 200 {
		t.Fatalf("session dry run with the CSRF token: %d %s", code, body)
	}

	// Signing out ends that session only.
	c2, csrf2 := signIn(t, srv, f.token)
	su, _ := url.Parse(srv.URL + "/")
	old := c2.Jar.Cookies(su)
	if len(old) != 1 {
		t.Fatalf("session cookies %v", old)
	}
	if resp, err := c2.PostForm(srv.URL+"/signout", url.Values{"csrf": {csrf2}}); err != nil {
		t.Fatal(err)
	} else {
		resp.Body.Close()
	}
	// The browser dropped the cookie; a copy kept from before is worthless too.
	if code, _ := call(t, nil, "GET", srv.URL+"/api/partitions", "", "", "Cookie", old[0].Name+"="+old[0].Value); code != http.StatusUnauthorized {
		t.Fatalf("the signed-out session's cookie: %d, want 401", code)
	}
	if code, _ := call(t, c, "GET", srv.URL+"/api/partitions", "", ""); code != 200 {
		t.Fatalf("the other session after a sign-out: %d, want 200", code)
	}

	// A new token: the old one and the sessions opened with it end; the new one works.
	time.Sleep(1100 * time.Millisecond) // the file is checked at most once a second
	newTok := f.token + "-rotated"
	f.writeToken(newTok)
	if code, _ := call(t, nil, "GET", srv.URL+"/api/partitions", f.token, ""); code != http.StatusUnauthorized {
		t.Fatalf("the old token after rotation: %d, want 401", code)
	}
	if code, _ := call(t, c, "GET", srv.URL+"/api/partitions", "", ""); code != http.StatusUnauthorized {
		t.Fatalf("a session of the old token after rotation: %d, want 401", code)
	}
	if code, _ := call(t, nil, "GET", srv.URL+"/api/partitions", newTok, ""); code != 200 {
		t.Fatalf("the new token: %d, want 200", code)
	}
	// A token file emptied by mistake refuses everyone rather than opening the console.
	time.Sleep(1100 * time.Millisecond)
	f.writeToken("")
	if code, _ := call(t, nil, "GET", srv.URL+"/api/partitions", newTok, ""); code != http.StatusUnauthorized {
		t.Fatalf("an empty token file: %d, want 401", code)
	}
	if code, _ := call(t, nil, "GET", srv.URL+"/api/partitions", "", "", "Authorization", "Bearer "); code != http.StatusUnauthorized {
		t.Fatalf("an empty bearer against an empty token file: %d, want 401", code)
	}
}

func call2(t *testing.T, c *http.Client, u string) string {
	_, b := call(t, c, "GET", u, "", "")
	return b
}

// The partitions view shows an out-of-band offset move as drift with both offsets, in the
// JSON API and in the first HTML of the page, with the classifier's word and what the
// consumer will do; the offsets page lists the watermark's audit trail.
func TestDriftAfterOutOfBandMoveIsShown(t *testing.T) {
	t.Parallel()
	f := newFixture(t)
	srv := f.server(nil)
	code, body := call(t, nil, "GET", srv.URL+"/api/partitions", f.token, "")
	if code != 200 {
		t.Fatalf("GET /api/partitions: %d %s", code, body)
	}
	var rows []PartitionRow
	if err := json.Unmarshal([]byte(body), &rows); err != nil {
		t.Fatal(err)
	}
	var row *PartitionRow
	for i := range rows {
		if rows[i].Group == f.group && rows[i].Topic == f.topic {
			row = &rows[i]
		}
	}
	if row == nil {
		t.Fatalf("no row for %s %s in %s", f.group, f.topic, body)
	}
	if row.Watermark != 10 || row.Committed != 15 || row.LogEnd != 15 || row.State != "kafka_ahead" || !row.Drifted ||
		row.Drift == nil || *row.Drift != 5 || !strings.Contains(row.Next, "[10, 15)") {
		t.Fatalf("row %+v: want watermark 10, committed 15, kafka_ahead, drift +5", *row)
	}
	_, page := call(t, nil, "GET", srv.URL+"/", f.token, "")
	tr := rowHTML(page, f.group+"|"+f.topic+"|0")
	if !strings.Contains(tr, `class="drift"`) || !strings.Contains(tr, `data-f="watermark">10<`) || !strings.Contains(tr, `data-f="committed">15<`) ||
		!strings.Contains(tr, "kafka_ahead") {
		t.Fatalf("the page's row does not show the drift with both offsets: %s", tr)
	}
	_, page = call(t, nil, "GET", srv.URL+"/offsets?group="+url.QueryEscape(f.group), f.token, "")
	if !strings.Contains(page, "first_run") {
		t.Fatalf("the offsets page lists no audit event: %.2000s", page)
	}
	code, body = call(t, nil, "GET", srv.URL+"/api/offsets/audit?group="+url.QueryEscape(f.group), f.token, "")
	if code != 200 || !strings.Contains(body, `"kind":"first_run"`) {
		t.Fatalf("GET /api/offsets/audit: %d %s", code, body)
	}
}

// rowHTML returns the <tr> with data-key key.
func rowHTML(page, key string) string {
	i := strings.Index(page, `data-key="`+key+`"`)
	if i < 0 {
		return ""
	}
	j := strings.Index(page[i:], "</tr>")
	if j < 0 {
		return page[i:]
	}
	return page[i : i+j]
}

// A replay through the API: its dry run changes nothing; the replay writes the outbox row,
// marks the dead letter and audits it with the console's actor, as `kafkatx dlq replay` does;
// a second replay is refused (409); the replayed record failing again is shown as a
// re-failure; no answer and no log line holds the database or the SASL password.
func TestReplayThroughTheAPIIsAuditedAndRefailuresShow(t *testing.T) {
	t.Parallel()
	f := newFixture(t)
	const saslPassword = "sasl-secret-never-shown"
	srv := f.server(func(c *Config) { c.Kafka["sasl.password"] = saslPassword })
	var bodies []string
	get := func(path string) string {
		code, body := call(t, nil, "GET", srv.URL+path, f.token, "")
		if code != 200 {
			t.Fatalf("GET %s: %d %s", path, code, body)
		}
		bodies = append(bodies, body)
		return body
	}
	var items []DeadLetterItem
	if err := json.Unmarshal([]byte(get("/api/dead-letters?topic="+f.topic)), &items); err != nil {
		t.Fatal(err)
	}
	if len(items) != 2 || items[0].Offset != 3 || items[1].Offset != 7 || items[0].Fingerprint != items[1].Fingerprint || items[0].Status != "new" {
		t.Fatalf("dead letters %+v: want offsets 3 and 7, one fingerprint, new", items)
	}
	if !strings.HasPrefix(items[0].Value, "8 B sha256:") || !strings.HasSuffix(items[0].Value, `"poison-3"`) {
		t.Fatalf("value summary %q", items[0].Value)
	}
	id := items[0].ID
	var groups struct{ Groups []FingerprintGroup }
	if err := json.Unmarshal([]byte(get("/api/dead-letters/groups?topic="+f.topic)), &groups); err != nil {
		t.Fatal(err)
	}
	if len(groups.Groups) != 1 || groups.Groups[0].Count != 2 || groups.Groups[0].New != 2 {
		t.Fatalf("groups %+v: want one fingerprint of 2", groups.Groups)
	}
	var det DeadLetterDetail
	if err := json.Unmarshal([]byte(get(fmt.Sprintf("/api/dead-letters/%d", id))), &det); err != nil {
		t.Fatal(err)
	}
	if det.ValueFull.Format != "hex" || !strings.Contains(det.ValueFull.Text, "poison-3") || len(det.Headers) != 1 || det.Headers[0].Key != "trace" ||
		!strings.Contains(det.FullError, "offset 3") {
		t.Fatalf("detail %+v", det)
	}
	// Filters: partition, error class, text, time.
	for q, want := range map[string]int{"partition=0": 2, "partition=1": 0, "q=OFFSET+7": 1, "q=nothing-like-this": 0,
		"error_class=" + url.QueryEscape(items[0].ErrorClass): 2, "error_class=other": 0, "since=1h": 2, "until=2000-01-01": 0, "status=replayed": 0} {
		var got []DeadLetterItem
		if err := json.Unmarshal([]byte(get("/api/dead-letters?topic="+f.topic+"&"+q)), &got); err != nil {
			t.Fatal(err)
		}
		if len(got) != want {
			t.Errorf("filter %s: %d dead letters, want %d", q, len(got), want)
		}
	}
	if code, _ := call(t, nil, "GET", srv.URL+"/api/dead-letters?partition=x", f.token, ""); code != http.StatusBadRequest {
		t.Errorf("a bad partition filter: %d, want 400", code)
	}

	outboxRows := func() int64 { return f.count(`SELECT count(*) FROM %s.outbox WHERE topic = $1`, f.topic) }
	replay := fmt.Sprintf("%s/api/dead-letters/%d/replay", srv.URL, id)
	if code, body := call(t, nil, "POST", replay, f.token, `{"dry_run":true}`); code != http.StatusBadRequest || !strings.Contains(body, "reason") {
		t.Fatalf("a replay without a reason: %d %s", code, body)
	}
	code, body := call(t, nil, "POST", replay, f.token, `{"reason":"dry run first","dry_run":true}`)
	if code != 200 || !strings.Contains(body, `"outcome":"would be replayed"`) || !strings.Contains(body, `"to_topic":"`+f.topic+`"`) {
		t.Fatalf("dry run: %d %s", code, body)
	}
	if st := f.str(`SELECT status FROM %s.dead_letters WHERE id = $1`, id); st != "new" || outboxRows() != 0 || f.count(`SELECT count(*) FROM %s.dlq_audit`) != 0 {
		t.Fatalf("the dry run changed something: status %s, %d outbox rows", st, outboxRows())
	}
	code, body = call(t, nil, "POST", replay, f.token, `{"reason":"fixed the decoder"}`, "X-Kafkatx-Actor", "bob")
	if code != 200 || !strings.Contains(body, `"outcome":"replayed"`) {
		t.Fatalf("replay: %d %s", code, body)
	}
	bodies = append(bodies, body)
	if st := f.str(`SELECT status FROM %s.dead_letters WHERE id = $1`, id); st != "replayed" {
		t.Fatalf("dead letter %d is %s after the replay", id, st)
	}
	actor := f.str(`SELECT actor FROM %s.dlq_audit WHERE dead_letter_id = $1 AND action = 'replay' AND reason = 'fixed the decoder'`, id)
	if !strings.HasPrefix(actor, "bob via console from 127.0.0.1") {
		t.Fatalf("audit actor %q", actor)
	}
	if n := f.count(`SELECT count(*) FROM %s.outbox WHERE topic = $1 AND value = 'poison-3'`, f.topic); n != 1 {
		t.Fatalf("%d outbox rows carry the replayed record", n)
	}
	if code, _ := call(t, nil, "POST", replay, f.token, `{"reason":"again"}`); code != http.StatusConflict {
		t.Fatalf("a second replay: %d, want 409", code)
	}
	if code, _ := call(t, nil, "POST", srv.URL+"/api/dead-letters/999999/replay", f.token, `{"reason":"x"}`); code != http.StatusNotFound {
		t.Fatalf("a replay of no dead letter: %d, want 404", code)
	}
	// A bulk discard of the fingerprint group, as a dry run: the one still new would go.
	fp := items[0].Fingerprint
	code, body = call(t, nil, "POST", srv.URL+"/api/dead-letters/discard", f.token,
		fmt.Sprintf(`{"reason":"bulk","dry_run":true,"filter":{"fingerprint":%q,"topic":%q}}`, fp, f.topic))
	var res ActionResult
	if err := json.Unmarshal([]byte(body), &res); code != 200 || err != nil || len(res.Items) != 1 || res.Items[0].ID != items[1].ID || res.Done != 1 {
		t.Fatalf("bulk dry run: %d %s", code, body)
	}
	if st := f.str(`SELECT status FROM %s.dead_letters WHERE id = $1`, items[1].ID); st != "new" {
		t.Fatalf("the bulk dry run discarded dead letter %d", items[1].ID)
	}
	// A selection: each item answers for itself.
	code, body = call(t, nil, "POST", srv.URL+"/api/dead-letters/replay", f.token,
		fmt.Sprintf(`{"reason":"selection","dry_run":true,"ids":[%d,%d,999999]}`, items[1].ID, id))
	if err := json.Unmarshal([]byte(body), &res); code != 200 || err != nil || len(res.Items) != 3 || res.Done != 1 || res.Refused != 2 ||
		!res.Items[0].OK || !strings.Contains(res.Items[1].Error, "already resolved") || !strings.Contains(res.Items[2].Error, "no such dead letter") {
		t.Fatalf("selection dry run: %d %s", code, body)
	}
	if code, _ := call(t, nil, "POST", srv.URL+"/api/dead-letters/replay", f.token, `{"reason":"x","ids":[1],"filter":{"topic":"t"}}`); code != http.StatusBadRequest {
		t.Fatalf("ids and a filter together: %d, want 400", code)
	}
	// The same from the page's group form: the page's other filters narrow the group.
	c, csrf := signIn(t, srv, f.token)
	form := url.Values{"csrf": {csrf}, "action": {"discard"}, "reason": {"bulk"}, "dry_run": {"1"}, "fingerprint": {fp},
		"group": {f.group}, "topic": {f.topic}, "partition": {"1"}}
	resp, err := c.PostForm(srv.URL+"/dead-letters/action", form)
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusBadRequest {
		t.Fatalf("group form narrowed to partition 1 (no dead letter): %d, want 400", resp.StatusCode)
	}
	form.Set("partition", "0")
	if resp, err = c.PostForm(srv.URL+"/dead-letters/action", form); err != nil {
		t.Fatal(err)
	}
	page, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if resp.StatusCode != 200 || !strings.Contains(string(page), "would be discarded") || !strings.Contains(string(page), fmt.Sprintf(`name="id" value="%d"`, items[1].ID)) {
		t.Fatalf("group form dry run: %d %.3000s", resp.StatusCode, page)
	}

	// The relay publishes the replayed record; the consumer (its offset aligned first) fails
	// on it again: a new dead letter, shown as the re-failure of the replayed one.
	f.runRelay(func() bool { return f.count(`SELECT count(*) FROM %s.outbox WHERE state = 'pending'`) == 0 })
	f.runConsumer(func() bool { return f.count(`SELECT count(*) FROM %s.dead_letters`) == 3 })
	var after []DeadLetterItem
	if err := json.Unmarshal([]byte(get("/api/dead-letters?topic="+f.topic)), &after); err != nil {
		t.Fatal(err)
	}
	if len(after) != 3 || after[0].ID != id || !after[0].Refailed || after[0].RefailedAs != after[2].ID || after[2].Offset < 15 {
		t.Fatalf("after the replay failed again: %+v", after)
	}
	pageHTML := get("/dead-letters?topic=" + f.topic)
	if !strings.Contains(pageHTML, "re-failed") {
		t.Fatal("the dead-letters page does not show the re-failure")
	}

	// No answer and no log line holds the database password, not even a page that echoes
	// the filter it was given.
	if f.password == "" {
		t.Fatal("DATABASE_URL has no password: this check needs one")
	}
	get("/dead-letters?topic=" + url.QueryEscape(f.password))
	get("/dead-letters?q=" + url.QueryEscape(saslPassword))
	for _, p := range []string{"/", "/outbox", "/api/outbox", "/offsets?group=" + url.QueryEscape(f.group), fmt.Sprintf("/dead-letters/%d", id)} {
		get(p)
	}
	for i, b := range append(bodies, f.logs.String()) {
		if strings.Contains(b, f.password) || strings.Contains(b, saslPassword) {
			t.Fatalf("answer %d holds the database or the SASL password: %.300s", i, b)
		}
	}
}

// A --read-only console answers 403 to every action, whoever asks, and changes nothing.
func TestReadOnlyRefusesEveryAction(t *testing.T) {
	t.Parallel()
	f := newFixture(t)
	srv := f.server(func(c *Config) { c.ReadOnly = true })
	id := f.firstDeadLetter()
	before := f.count(`SELECT count(*) FROM %s.offset_audit`)
	for _, a := range []struct{ path, body string }{
		{fmt.Sprintf("/api/dead-letters/%d/replay", id), `{"reason":"r"}`},
		{fmt.Sprintf("/api/dead-letters/%d/discard", id), `{"reason":"r"}`},
		{fmt.Sprintf("/api/dead-letters/%d/replay", id), `{"reason":"r","dry_run":true}`},
		{"/api/dead-letters/replay", fmt.Sprintf(`{"reason":"r","ids":[%d]}`, id)},
		{"/api/outbox/1/release", `{"reason":"r"}`},
		{"/api/offsets/reset", fmt.Sprintf(`{"group":%q,"topic":%q,"to_database":true,"reason":"r"}`, f.group, f.topic)},
	} {
		if code, body := call(t, nil, "POST", srv.URL+a.path, f.token, a.body); code != http.StatusForbidden {
			t.Errorf("read-only POST %s: %d %s, want 403", a.path, code, body)
		}
	}
	c, csrf := signIn(t, srv, f.token)
	resp, err := c.PostForm(srv.URL+"/dead-letters/action", url.Values{"csrf": {csrf}, "action": {"discard"}, "reason": {"r"}, "id": {fmt.Sprint(id)}})
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusForbidden {
		t.Errorf("read-only form action: %d, want 403", resp.StatusCode)
	}
	if page := call2(t, c, fmt.Sprintf("%s/dead-letters/%d", srv.URL, id)); strings.Contains(page, `id="dl-action"`) {
		t.Error("a read-only console shows the action form")
	}
	if st := f.str(`SELECT status FROM %s.dead_letters WHERE id = $1`, id); st != "new" {
		t.Fatalf("read-only console changed dead letter %d to %s", id, st)
	}
	if n := f.count(`SELECT count(*) FROM %s.dlq_audit`); n != 0 {
		t.Fatalf("%d dlq_audit rows", n)
	}
	if n := f.count(`SELECT count(*) FROM %s.offset_audit`); n != before {
		t.Fatalf("offset_audit went from %d to %d rows", before, n)
	}
	code, body := call(t, nil, "GET", srv.URL+"/api/partitions", f.token, "")
	if code != 200 || !strings.Contains(body, `"committed":15`) {
		t.Fatalf("partitions after refused actions: %d %s", code, body)
	}
}

// offsets reset through the console is the CLI's code path: refused (409) while the group has
// an active member, a dry run answers the plan and changes nothing, and the execution moves
// both sides in lockstep with an audit row naming the console's actor.
func TestOffsetsResetRefusedWhileActiveThenAligned(t *testing.T) {
	t.Parallel()
	f := newFixture(t)
	srv := f.server(nil)
	body := fmt.Sprintf(`{"group":%q,"topic":%q,"to_offset":15,"mode":"skip","reason":"skip the 5 new orders"}`, f.group, f.topic)
	stop := f.startConsumer()
	deadline := time.Now().Add(60 * time.Second)
	for f.watermark() != 15 { // the consumer follows Kafka on assignment: it is a member now
		if time.Now().After(deadline) {
			stop()
			t.Fatal("the consumer did not follow Kafka to 15")
		}
		time.Sleep(100 * time.Millisecond)
	}
	code, resp := call(t, nil, "POST", srv.URL+"/api/offsets/reset", f.token, body)
	stop()
	if code != http.StatusConflict || !strings.Contains(resp, "active member") {
		t.Fatalf("reset while the group is active: %d %s, want 409", code, resp)
	}
	auditBefore := f.count(`SELECT count(*) FROM %s.offset_audit WHERE kind = 'replay'`)
	// Replay [12, 15): a dry run first.
	replay := fmt.Sprintf(`{"group":%q,"topic":%q,"to_offset":12,"mode":"replay","reason":"re-run three orders","dry_run":true}`, f.group, f.topic)
	var res ResetResult
	for {
		code, resp = call(t, nil, "POST", srv.URL+"/api/offsets/reset", f.token, replay)
		if code != http.StatusConflict || time.Now().After(deadline) {
			break
		}
		time.Sleep(500 * time.Millisecond) // the member's leave may take a moment
	}
	if err := json.Unmarshal([]byte(resp), &res); code != 200 || err != nil || len(res.Steps) != 1 || res.Steps[0].Action != "replay" || res.Steps[0].Messages != 3 || res.Executed {
		t.Fatalf("dry run: %d %s", code, resp)
	}
	if f.watermark() != 15 || f.count(`SELECT count(*) FROM %s.offset_audit WHERE kind = 'replay'`) != auditBefore {
		t.Fatal("the dry run changed something")
	}
	code, resp = call(t, nil, "POST", srv.URL+"/api/offsets/reset", f.token, strings.Replace(replay, `"dry_run":true`, `"dry_run":false`, 1), "X-Kafkatx-Actor", "carol")
	if err := json.Unmarshal([]byte(resp), &res); code != 200 || err != nil || !res.Executed {
		t.Fatalf("reset: %d %s", code, resp)
	}
	if f.watermark() != 12 {
		t.Fatalf("watermark %d after the replay reset, want 12", f.watermark())
	}
	if a := f.str(`SELECT actor FROM %s.offset_audit WHERE kind = 'replay' ORDER BY id DESC LIMIT 1`); !strings.HasPrefix(a, "carol via console") {
		t.Fatalf("offset audit actor %q", a)
	}
	_, resp = call(t, nil, "GET", srv.URL+"/api/partitions?group="+url.QueryEscape(f.group), f.token, "")
	if !strings.Contains(resp, `"watermark":12,"committed":12`) || !strings.Contains(resp, `"state":"aligned"`) {
		t.Fatalf("partitions after the reset: %s", resp)
	}
	if code, _ := call(t, nil, "POST", srv.URL+"/api/offsets/reset", f.token, `{"group":"g","topic":"t","reason":"r"}`); code != http.StatusBadRequest {
		t.Fatalf("a reset without a target: %d, want 400", code)
	}
}
