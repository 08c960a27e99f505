package console

import (
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"net/url"
	"regexp"
	"sort"
	"strconv"
	"strings"
	"time"
	"unicode/utf8"

	"github.com/kafkatx/kafkatx/dlq"
	"github.com/kafkatx/kafkatx/pg"
)

// Bounds of the dead-letter views.
const (
	// defaultListLimit and maxListLimit bound GET /api/dead-letters (limit=N).
	defaultListLimit = 100
	maxListLimit     = 1000
	// maxGrouped is how many dead letters the fingerprint grouping reads at most.
	maxGrouped = 5000
	// maxPayloadShown bounds a key, value or header value shown in full, in bytes.
	maxPayloadShown = 64 << 10
)

// DeadLetterItem is a dead letter in GET /api/dead-letters (oldest first): dlq.View (the
// shape kafkatx dlq list --output json shares; its error_message is dlq.ErrorLine's) with the
// key and value as summaries.
type DeadLetterItem struct {
	dlq.View
	Key   string `json:"key"`   // summary: size, SHA-256 prefix, escaped prefix
	Value string `json:"value"` // summary, as Key
	// Fingerprint groups failures alike: group, topic, error class and the error message's
	// first line with numbers and hex runs blanked (12 hex digits of a SHA-256).
	Fingerprint string `json:"fingerprint"`
	// Replays counts the audited replays; RefailedAs names a later dead letter of the
	// replayed record (same group, topic, key and value); Refailed is true when the message
	// failed again after a replay (either way).
	Replays    int   `json:"replays"`
	RefailedAs int64 `json:"refailed_as,omitempty"`
	Refailed   bool  `json:"refailed"`
}

// Payload is a key, value or header value shown in full: JSON indented when it is JSON,
// else a hex dump (offsets, hex bytes, printable characters).
type Payload struct {
	Format    string `json:"format"` // "json", "hex" or "null"
	Size      int    `json:"size"`   // bytes
	Text      string `json:"text"`
	Truncated bool   `json:"truncated,omitempty"` // only the first 64 KiB are shown
}

// HeaderItem is one original record header.
type HeaderItem struct {
	Key string `json:"key"`
	// KeyInvalidUTF8 is true when the key's bytes are not UTF-8: Key is then their Go-escaped
	// form (\xff for a byte that is no character).
	KeyInvalidUTF8 bool    `json:"key_invalid_utf8,omitempty"`
	Value          Payload `json:"value"`
}

// DeadLetterDetail is GET /api/dead-letters/{id}: the list item, the full payload, headers,
// error, stack and audit trail.
type DeadLetterDetail struct {
	DeadLetterItem
	FullError string           `json:"error_full"`
	Stack     string           `json:"stack"`
	KeyFull   Payload          `json:"key_payload"`
	ValueFull Payload          `json:"value_payload"`
	Headers   []HeaderItem     `json:"headers"`
	Audit     []dlq.AuditEntry `json:"audit"`
}

// FingerprintGroup is one group of GET /api/dead-letters/groups.
type FingerprintGroup struct {
	Fingerprint string    `json:"fingerprint"`
	Group       string    `json:"group"`
	Topic       string    `json:"topic"`
	ErrorClass  string    `json:"error_class"`
	Message     string    `json:"message"` // the normalized first line
	Count       int       `json:"count"`
	New         int       `json:"new"` // still to act on
	Refailed    int       `json:"refailed"`
	First       time.Time `json:"first_failure"`
	Last        time.Time `json:"last_failure"`
	IDs         []int64   `json:"ids"`
}

var (
	// A UUID first (its first group alone is also a hex run), then hex runs of 8 or more.
	reHexRun = regexp.MustCompile(`[0-9a-fA-F]{8}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{12}|\b(0x)?[0-9a-fA-F]{8,}\b`)
	reNumber = regexp.MustCompile(`\d+`)
	reSpaces = regexp.MustCompile(`\s+`)
)

// normalizeMessage is an error message's first line with ids, hex runs and numbers blanked
// to "#", white space collapsed, at most 200 bytes.
func normalizeMessage(msg string) string {
	if i := strings.IndexByte(msg, '\n'); i >= 0 {
		msg = msg[:i]
	}
	msg = reHexRun.ReplaceAllString(msg, "#")
	msg = reNumber.ReplaceAllString(msg, "#")
	msg = strings.TrimSpace(reSpaces.ReplaceAllString(msg, " "))
	return pg.SanitizeText(msg, 200)
}

// fingerprint identifies failures alike (see DeadLetterItem.Fingerprint).
func fingerprint(group, topic, class, msg string) string {
	sum := sha256.Sum256([]byte(group + "\x00" + topic + "\x00" + class + "\x00" + normalizeMessage(msg)))
	return hex.EncodeToString(sum[:6])
}

// summaryPrefix is how many bytes of a key or value a summary shows (and a list reads).
const summaryPrefix = 32

// summaryOf describes bytes without showing them in full: size, SHA-256 prefix and an
// escaped prefix of at most 32 bytes, from a prefix of the bytes, their whole size and
// their SHA-256 sum.
func summaryOf(prefix []byte, size int, sum []byte) string {
	if prefix == nil {
		return "null"
	}
	cut := ""
	if len(prefix) > summaryPrefix {
		prefix = prefix[:summaryPrefix]
	}
	if size > len(prefix) {
		cut = "…"
	}
	if len(sum) > 4 {
		sum = sum[:4]
	}
	return fmt.Sprintf("%d B sha256:%x %s%s", size, sum, strconv.Quote(string(prefix)), cut)
}

// maskedPayload formats b (masked already) for display, masking a secret's beginning
// where the 64 KiB shown cut it.
func (h *Handler) maskedPayload(b []byte) Payload {
	if len(b) <= maxPayloadShown {
		return payloadOf(b)
	}
	size := len(b)
	p := payloadOf(h.mask.Bytes(b[:maxPayloadShown], true))
	p.Size, p.Truncated = size, true
	return p
}

// headerItem is one header for display: a key that is not valid UTF-8 is shown as its
// bytes, Go-escaped ("k\xffey"), with KeyInvalidUTF8 set, not as replacement characters.
func headerItem(key string, v Payload) HeaderItem {
	if utf8.ValidString(key) {
		return HeaderItem{Key: key, Value: v}
	}
	q := strconv.Quote(key)
	return HeaderItem{Key: q[1 : len(q)-1], KeyInvalidUTF8: true, Value: v}
}

// payloadOf formats b for display.
func payloadOf(b []byte) Payload {
	if b == nil {
		return Payload{Format: "null", Text: "null"}
	}
	p := Payload{Size: len(b)}
	if json.Valid(b) && len(b) <= maxPayloadShown {
		if o, err := indentJSON(b); err == nil {
			p.Format, p.Text = "json", string(o)
			return p
		}
	}
	if len(b) > maxPayloadShown {
		b, p.Truncated = b[:maxPayloadShown], true
	}
	p.Format, p.Text = "hex", hex.Dump(b)
	return p
}

func indentJSON(b []byte) ([]byte, error) {
	var v json.RawMessage = b
	return json.MarshalIndent(v, "", "  ")
}

func itemOf(f dlq.Found) DeadLetterItem {
	d := f.DeadLetter
	it := DeadLetterItem{View: dlq.ViewOf(&d, false), Key: summaryOf(d.Key, f.KeySize, f.KeySHA256), Value: summaryOf(d.Value, f.ValueSize, f.ValueSHA256),
		Fingerprint: fingerprint(d.Group, d.Topic, d.ErrorClass, d.ErrorMessage), Replays: f.Replays, RefailedAs: f.RefailedAs}
	it.Refailed = f.RefailedAs != 0 || (d.Status == dlq.StatusNew && f.Replays > 0)
	return it
}

// dlFilter is a dead-letter selection as the query string gives it.
type dlFilter struct {
	Query       dlq.Query
	Fingerprint string
	Raw         url.Values // the query string's filter fields, for links and forms
}

// filterFields are the query parameters of a dead-letter selection.
var filterFields = []string{"status", "group", "topic", "partition", "error_class", "since", "until", "q", "fingerprint"}

// parseFilter reads topic, partition, group, error_class, status (new, replayed, discarded;
// "" or all: any), since and until (RFC 3339 times, or a duration such as 24h meaning that
// long ago), q (text in the error or stack), fingerprint, after (id) and limit.
func parseFilter(v url.Values) (dlFilter, error) {
	f := dlFilter{Raw: url.Values{}}
	for _, k := range filterFields {
		if s := strings.TrimSpace(v.Get(k)); s != "" {
			f.Raw.Set(k, s)
		}
	}
	q := &f.Query
	q.Group, q.Topic, q.ErrorClass, q.Text = f.Raw.Get("group"), f.Raw.Get("topic"), f.Raw.Get("error_class"), f.Raw.Get("q")
	f.Fingerprint = f.Raw.Get("fingerprint")
	switch s := f.Raw.Get("status"); s {
	case "", "all":
	case dlq.StatusNew, dlq.StatusReplayed, dlq.StatusDiscarded:
		q.Status = s
	default:
		return f, fmt.Errorf("status %q: want new, replayed, discarded or all", s)
	}
	if s := f.Raw.Get("partition"); s != "" {
		p, err := strconv.ParseInt(s, 10, 32)
		if err != nil || p < 0 {
			return f, fmt.Errorf("partition %q: want a partition number (0 or more)", s)
		}
		p32 := int32(p)
		q.Partition = &p32
	}
	var err error
	if q.Since, err = parseWhen(f.Raw.Get("since")); err != nil {
		return f, fmt.Errorf("since: %w", err)
	}
	if q.Until, err = parseWhen(f.Raw.Get("until")); err != nil {
		return f, fmt.Errorf("until: %w", err)
	}
	if s := v.Get("after"); s != "" {
		if q.AfterID, err = strconv.ParseInt(s, 10, 64); err != nil || q.AfterID < 0 {
			return f, fmt.Errorf("after %q: want a dead letter id", s)
		}
	}
	q.Limit = defaultListLimit
	if s := v.Get("limit"); s != "" {
		n, err := strconv.Atoi(s)
		if err != nil || n < 1 || n > maxListLimit {
			return f, fmt.Errorf("limit %q: want 1 to %d", s, maxListLimit)
		}
		q.Limit = n
	}
	return f, nil
}

// parseWhen reads an RFC 3339 time, a date (2006-01-02, UTC), or a duration before now.
func parseWhen(s string) (time.Time, error) {
	if s == "" {
		return time.Time{}, nil
	}
	if t, err := time.Parse(time.RFC3339Nano, s); err == nil {
		return t, nil
	}
	if t, err := time.Parse("2006-01-02T15:04", s); err == nil { // an HTML datetime-local field, UTC
		return t, nil
	}
	if t, err := time.Parse("2006-01-02", s); err == nil {
		return t, nil
	}
	if d, err := time.ParseDuration(s); err == nil && d > 0 {
		return time.Now().Add(-d), nil
	}
	return time.Time{}, fmt.Errorf("%q: want an RFC 3339 time (2025-01-31T12:00:00Z), a date or a duration such as 24h", s)
}

// search lists the dead letters of f (fingerprint applied after the query).
func (h *Handler) search(r *http.Request, f dlFilter) ([]DeadLetterItem, error) {
	q := f.Query
	q.Prefix = summaryPrefix
	found, err := dlq.Search(r.Context(), h.cfg.Pool, h.cfg.Schema, q)
	if err != nil {
		return nil, err
	}
	out := []DeadLetterItem{}
	for _, d := range found {
		h.mask.DeadLetter(&d.DeadLetter, d.KeySize, d.ValueSize)
		it := itemOf(d)
		if f.Fingerprint == "" || it.Fingerprint == f.Fingerprint {
			out = append(out, it)
		}
	}
	return out, nil
}

// groupsOf reads up to maxGrouped dead letters of f and groups them by fingerprint, most
// numerous first. truncated is true when more matched.
func (h *Handler) groupsOf(r *http.Request, f dlFilter) (groups []FingerprintGroup, truncated bool, err error) {
	q := f.Query
	q.AfterID, q.Limit, q.Prefix = 0, maxListLimit, 1
	by := map[string]*FingerprintGroup{}
	n := 0
	for {
		found, err := dlq.Search(r.Context(), h.cfg.Pool, h.cfg.Schema, q)
		if err != nil {
			return nil, false, err
		}
		for _, d := range found {
			h.mask.DeadLetter(&d.DeadLetter, d.KeySize, d.ValueSize)
			it := itemOf(d)
			if f.Fingerprint != "" && it.Fingerprint != f.Fingerprint {
				continue
			}
			g := by[it.Fingerprint]
			if g == nil {
				g = &FingerprintGroup{Fingerprint: it.Fingerprint, Group: it.Group, Topic: it.Topic, ErrorClass: it.ErrorClass,
					Message: normalizeMessage(d.ErrorMessage), First: it.FirstFailure, Last: it.LastFailure}
				by[it.Fingerprint] = g
			}
			g.Count++
			if it.Status == dlq.StatusNew {
				g.New++
				if len(g.IDs) < maxActionItems {
					g.IDs = append(g.IDs, it.ID)
				}
			}
			if it.Refailed {
				g.Refailed++
			}
			g.First = minTime(g.First, it.FirstFailure)
			if it.LastFailure.After(g.Last) {
				g.Last = it.LastFailure
			}
		}
		n += len(found)
		if len(found) < q.Limit || n >= maxGrouped {
			truncated = len(found) == q.Limit && n >= maxGrouped
			break
		}
		q.AfterID = found[len(found)-1].ID
	}
	for _, g := range by {
		groups = append(groups, *g)
	}
	sort.Slice(groups, func(i, j int) bool {
		if groups[i].Count != groups[j].Count {
			return groups[i].Count > groups[j].Count
		}
		return groups[i].Fingerprint < groups[j].Fingerprint
	})
	return groups, truncated, nil
}

func minTime(a, b time.Time) time.Time {
	if b.Before(a) {
		return b
	}
	return a
}

// detail reads one dead letter in full.
func (h *Handler) detail(r *http.Request, id int64) (*DeadLetterDetail, error) {
	found, err := dlq.Search(r.Context(), h.cfg.Pool, h.cfg.Schema, dlq.Query{Filter: dlq.Filter{AfterID: id - 1, Limit: 1}})
	if err != nil {
		return nil, err
	}
	if len(found) == 0 || found[0].ID != id {
		return nil, fmt.Errorf("dead letter %d: %w", id, dlq.ErrNotFound)
	}
	d := found[0]
	h.mask.DeadLetter(&d.DeadLetter, len(d.Key), len(d.Value))
	det := &DeadLetterDetail{DeadLetterItem: itemOf(d), FullError: d.ErrorMessage, Stack: d.Stack,
		KeyFull: h.maskedPayload(d.Key), ValueFull: h.maskedPayload(d.Value), Headers: []HeaderItem{}}
	for _, hd := range d.Headers {
		det.Headers = append(det.Headers, headerItem(hd.Key, h.maskedPayload(hd.Value)))
	}
	if det.Audit, err = dlq.Audit(r.Context(), h.cfg.Pool, h.cfg.Schema, id); err != nil {
		return nil, err
	}
	if det.Audit == nil {
		det.Audit = []dlq.AuditEntry{}
	}
	return det, nil
}

// apiDeadLetters answers GET /api/dead-letters?filters: dead letters, oldest first.
func (h *Handler) apiDeadLetters(w http.ResponseWriter, r *http.Request) {
	f, err := parseFilter(r.URL.Query())
	if err != nil {
		h.fail(w, r, http.StatusBadRequest, err.Error())
		return
	}
	items, err := h.search(r, f)
	if err != nil {
		h.fail(w, r, http.StatusInternalServerError, err.Error())
		return
	}
	h.writeJSON(w, http.StatusOK, items)
}

// apiDeadLetterGroups answers GET /api/dead-letters/groups?filters.
func (h *Handler) apiDeadLetterGroups(w http.ResponseWriter, r *http.Request) {
	f, err := parseFilter(r.URL.Query())
	if err != nil {
		h.fail(w, r, http.StatusBadRequest, err.Error())
		return
	}
	groups, truncated, err := h.groupsOf(r, f)
	if err != nil {
		h.fail(w, r, http.StatusInternalServerError, err.Error())
		return
	}
	if groups == nil {
		groups = []FingerprintGroup{}
	}
	h.writeJSON(w, http.StatusOK, struct {
		Groups    []FingerprintGroup `json:"groups"`
		Truncated bool               `json:"truncated"`
	}{groups, truncated})
}

func pathID(r *http.Request) (int64, error) {
	id, err := strconv.ParseInt(r.PathValue("id"), 10, 64)
	if err != nil || id <= 0 {
		return 0, fmt.Errorf("id %q: want a positive number", r.PathValue("id"))
	}
	return id, nil
}

// apiDeadLetter answers GET /api/dead-letters/{id}.
func (h *Handler) apiDeadLetter(w http.ResponseWriter, r *http.Request) {
	id, err := pathID(r)
	if err != nil {
		h.fail(w, r, http.StatusBadRequest, err.Error())
		return
	}
	det, err := h.detail(r, id)
	switch {
	case errors.Is(err, dlq.ErrNotFound):
		h.fail(w, r, http.StatusNotFound, err.Error())
	case err != nil:
		h.fail(w, r, http.StatusInternalServerError, err.Error())
	default:
		h.writeJSON(w, http.StatusOK, det)
	}
}

// apiDeadLetterAction answers POST /api/dead-letters/{id}/replay|discard with a JSON body
// ActionParams: 200 and the ActionResult; 404 no such dead letter, 409 not new (already
// replayed or discarded), 400 a bad body.
func (h *Handler) apiDeadLetterAction(w http.ResponseWriter, r *http.Request) {
	action, id, p, ok := h.oneItemAction(w, r, "a dead letter", actReplay, actDiscard)
	if !ok {
		return
	}
	res := h.deadLetterAction(r.Context(), action, []int64{id}, p, h.actor(r))
	status := http.StatusOK
	if it := res.Items[0]; !it.OK {
		switch {
		case it.NotFound:
			status = http.StatusNotFound
		case it.Resolved:
			status = http.StatusConflict
		default:
			status = http.StatusInternalServerError
		}
	}
	h.writeJSON(w, status, res)
}

// BulkParams is the body of POST /api/dead-letters/replay|discard: ActionParams and either
// ids or a filter (the query parameters of GET /api/dead-letters, fingerprint included),
// which selects the new dead letters it matches (at most 1000).
type BulkParams struct {
	ActionParams
	IDs    []int64           `json:"ids,omitempty"`
	Filter map[string]string `json:"filter,omitempty"`
}

// apiDeadLettersAction answers POST /api/dead-letters/replay|discard: 200 and the
// ActionResult with one item per dead letter (each refused one says why).
func (h *Handler) apiDeadLettersAction(w http.ResponseWriter, r *http.Request) {
	action := r.PathValue("action")
	if action != actReplay && action != actDiscard {
		h.fail(w, r, http.StatusNotFound, fmt.Sprintf("no action %q on dead letters: replay or discard", action))
		return
	}
	var p BulkParams
	if err := decodeJSON(r, &p); err != nil {
		h.fail(w, r, http.StatusBadRequest, "body: "+err.Error())
		return
	}
	ids, err := h.selectIDs(r, p.IDs, p.Filter)
	if err != nil {
		h.fail(w, r, http.StatusBadRequest, err.Error())
		return
	}
	if err := checkParams(p.ActionParams, ids); err != nil {
		h.fail(w, r, http.StatusBadRequest, err.Error())
		return
	}
	h.writeJSON(w, http.StatusOK, h.deadLetterAction(r.Context(), action, ids, p.ActionParams, h.actor(r)))
}

// selectIDs returns ids, or the new dead letters a filter selects (never both).
func (h *Handler) selectIDs(r *http.Request, ids []int64, filter map[string]string) ([]int64, error) {
	if len(ids) > 0 && len(filter) > 0 {
		return nil, errors.New("give ids or a filter, not both")
	}
	if len(filter) == 0 {
		return ids, nil
	}
	v := url.Values{}
	for k, s := range filter {
		if !contains(filterFields, k) {
			return nil, fmt.Errorf("filter field %q: want one of %s", k, strings.Join(filterFields, ", "))
		}
		v.Set(k, s)
	}
	v.Set("status", dlq.StatusNew)
	v.Set("limit", strconv.Itoa(maxListLimit))
	f, err := parseFilter(v)
	if err != nil {
		return nil, err
	}
	items, err := h.search(r, f)
	if err != nil {
		return nil, err
	}
	out := []int64{}
	for _, it := range items {
		out = append(out, it.ID)
	}
	if len(out) == 0 {
		return nil, errors.New("the filter selects no new dead letter")
	}
	return out, nil
}

func contains(list []string, s string) bool {
	for _, x := range list {
		if x == s {
			return true
		}
	}
	return false
}

// deadLettersView is the data of the dead-letters page.
type deadLettersView struct {
	Filter    url.Values
	Query     string // the filter as a query string
	Groups    []FingerprintGroup
	Truncated bool
	Items     []DeadLetterItem
	More      bool
	NextAfter int64
}

// deadLettersPage renders GET /dead-letters?filters: the groups and the list.
func (h *Handler) deadLettersPage(w http.ResponseWriter, r *http.Request) {
	p := h.page(r, "dead-letters", "Dead letters", nil)
	f, err := parseFilter(r.URL.Query())
	if err != nil {
		p.Error = err.Error()
		p.Data = deadLettersView{Filter: f.Raw}
		h.render(w, r, http.StatusBadRequest, "deadletters", p)
		return
	}
	v := deadLettersView{Filter: f.Raw, Query: f.Raw.Encode()}
	if v.Groups, v.Truncated, err = h.groupsOf(r, f); err == nil {
		v.Items, err = h.search(r, f)
	}
	if err != nil {
		p.Error = err.Error()
	}
	if len(v.Items) == f.Query.Limit {
		v.More, v.NextAfter = true, v.Items[len(v.Items)-1].ID
	}
	p.Data = v
	h.render(w, r, http.StatusOK, "deadletters", p)
}

// deadLetterPage renders GET /dead-letters/{id}.
func (h *Handler) deadLetterPage(w http.ResponseWriter, r *http.Request) {
	id, err := pathID(r)
	if err != nil {
		h.fail(w, r, http.StatusBadRequest, err.Error())
		return
	}
	det, err := h.detail(r, id)
	switch {
	case errors.Is(err, dlq.ErrNotFound):
		h.fail(w, r, http.StatusNotFound, err.Error())
		return
	case err != nil:
		h.fail(w, r, http.StatusInternalServerError, err.Error())
		return
	}
	h.render(w, r, http.StatusOK, "deadletter", h.page(r, "dead-letters", fmt.Sprintf("Dead letter %d", id), det))
}

// resultView is the data of an action's result page.
type resultView struct {
	On      string // "dead-letters" or "outbox"
	Result  ActionResult
	IDs     []int64 // what to act on when the operator confirms a dry run
	Confirm bool    // a dry run that would do something: offer to execute it
	Back    string
	Rate    int // dead letters: the executed action's items a second (ActionParams.RatePerSecond)
}

// deadLettersActionForm handles the forms of the dead-letter pages (POST /dead-letters/action):
// action, reason, dry_run (the "Dry run" button) and the ids (checkboxes), or a fingerprint
// with the filter fields.
func (h *Handler) deadLettersActionForm(w http.ResponseWriter, r *http.Request) {
	if err := r.ParseForm(); err != nil {
		h.fail(w, r, http.StatusBadRequest, "bad form: "+err.Error())
		return
	}
	action := r.PostFormValue("action")
	if action != actReplay && action != actDiscard {
		h.fail(w, r, http.StatusBadRequest, fmt.Sprintf("no action %q on dead letters: replay or discard", action))
		return
	}
	var ids []int64
	for _, s := range r.PostForm["id"] {
		id, err := strconv.ParseInt(s, 10, 64)
		if err != nil {
			h.fail(w, r, http.StatusBadRequest, fmt.Sprintf("id %q: want a number", s))
			return
		}
		ids = append(ids, id)
	}
	filter := map[string]string{}
	if len(ids) == 0 {
		for _, k := range filterFields {
			if s := r.PostFormValue(k); s != "" && k != "status" {
				filter[k] = s
			}
		}
	}
	p := ActionParams{Reason: r.PostFormValue("reason"), DryRun: r.PostFormValue("dry_run") != ""}
	if s := r.PostFormValue("rate_per_second"); s != "" {
		n, err := strconv.Atoi(s)
		if err != nil {
			h.fail(w, r, http.StatusBadRequest, fmt.Sprintf("rate_per_second %q: want a number of items a second", s))
			return
		}
		p.RatePerSecond = n
	}
	ids, err := h.selectIDs(r, ids, filter)
	if err == nil {
		err = checkParams(p, ids)
	}
	if err != nil {
		h.fail(w, r, http.StatusBadRequest, err.Error())
		return
	}
	res := h.deadLetterAction(r.Context(), action, ids, p, h.actor(r))
	back := h.cfg.BasePath + "/dead-letters"
	if len(ids) == 1 {
		back = fmt.Sprintf("%s/dead-letters/%d", h.cfg.BasePath, ids[0])
	}
	h.render(w, r, http.StatusOK, "result", h.page(r, "dead-letters", "Dead letters: "+action,
		resultView{On: "dead-letters", Result: res, IDs: ids, Confirm: res.DryRun && res.Done > 0, Back: back, Rate: p.rateOf()}))
}
