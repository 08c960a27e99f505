package console

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"slices"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"
	"go.uber.org/zap"

	"github.com/kafkatx/kafkatx/dlq"
	"github.com/kafkatx/kafkatx/internal/kafkaname"
	"github.com/kafkatx/kafkatx/outbox"
)

// This file is the one place the console acts on dead letters and parked outbox rows. It calls
// the functions `kafkatx dlq replay|discard` and `kafkatx outbox release|discard` call
// (dlq.ReplayTx, dlq.DiscardTx, outbox.Writer.ReleaseTx and DiscardTx), one transaction per
// item, so the effect and the audit row (dlq_audit, outbox_audit) are the command's. A dry run
// runs the very same transaction and rolls it back: it reports what would happen (or why the
// item would be refused) and changes nothing.

// Action names of the API and the forms.
const (
	actReplay  = "replay"
	actDiscard = "discard"
	actRelease = "release"
)

// maxActionItems bounds the items of one action (a selection or a fingerprint group).
const maxActionItems = 1000

// ActionParams are the fields every action's body carries.
type ActionParams struct {
	// Reason is why (required, as the CLI's --reason; recorded in the audit row).
	Reason string `json:"reason"`
	// DryRun answers what would happen and changes nothing.
	DryRun bool `json:"dry_run"`
	// ToTopic (replay only) publishes to this topic instead of the dead letter's own.
	ToTopic string `json:"to_topic,omitempty"`
	// Again (replay only) replays a dead letter already replayed (the CLI's --again).
	Again bool `json:"again,omitempty"`
	// RatePerSecond bounds an executed action on several dead letters to this many items a
	// second (a bulk redrive does not flood the topic and its consumer). Defaults to
	// RedriveRateDefault (50); 1 to 1,000; refused when the selection would take longer than
	// the request may (RequestTimeout). Dry runs are not slowed.
	RatePerSecond int `json:"rate_per_second,omitempty"`
}

// RedriveRateDefault is ActionParams.RatePerSecond's default, in items a second.
const RedriveRateDefault = 50

// MaxRedriveRate bounds ActionParams.RatePerSecond (and `kafkatx parked-keys release --rate`).
const MaxRedriveRate = 1000

// rateOf is p's rate, defaulted.
func (p ActionParams) rateOf() int {
	if p.RatePerSecond == 0 {
		return RedriveRateDefault
	}
	return p.RatePerSecond
}

// ItemResult is what an action did, or would do, to one dead letter or outbox row.
type ItemResult struct {
	ID int64 `json:"id"`
	// OK is false when the item was refused (Error says why).
	OK bool `json:"ok"`
	// Outcome is "replayed", "discarded" or "released", prefixed with "would be " in a dry run,
	// or "refused".
	Outcome string `json:"outcome"`
	// ToTopic and OutboxRow: where a replay publishes and the outbox row it wrote (in a dry
	// run, the row id the rolled-back transaction took; no row remains).
	ToTopic   string `json:"to_topic,omitempty"`
	OutboxRow int64  `json:"outbox_row,omitempty"`
	Error     string `json:"error,omitempty"`
	// NotFound and Resolved classify a refusal (the CLI's exit status 6).
	NotFound bool `json:"-"`
	Resolved bool `json:"-"`
}

// ActionResult is the answer of every action.
type ActionResult struct {
	Action string       `json:"action"`
	DryRun bool         `json:"dry_run"`
	Reason string       `json:"reason"`
	Actor  string       `json:"actor"`
	Items  []ItemResult `json:"items"`
	// Done counts the items acted on (or that would be, in a dry run); Refused the others.
	Done    int `json:"done"`
	Refused int `json:"refused"`
}

// checkParams validates the fields every action shares.
func checkParams(p ActionParams, ids []int64) error {
	switch {
	case strings.TrimSpace(p.Reason) == "":
		return errors.New(`reason is required: say why, for the audit trail ({"reason": "..."})`)
	case p.ToTopic != "" && kafkaname.Topic(p.ToTopic) != nil:
		return fmt.Errorf("to_topic: %v", kafkaname.Topic(p.ToTopic))
	case len(ids) == 0:
		return errors.New("nothing selected: give at least one id")
	case len(ids) > maxActionItems:
		return fmt.Errorf("%d items selected: at most %d in one action", len(ids), maxActionItems)
	case p.RatePerSecond < 0 || p.RatePerSecond > MaxRedriveRate:
		return fmt.Errorf("rate_per_second %d: want 1 to %d (default %d)", p.RatePerSecond, MaxRedriveRate, RedriveRateDefault)
	case !p.DryRun && time.Duration(len(ids)-1)*time.Second/time.Duration(p.rateOf()) > RequestTimeout-5*time.Second:
		return fmt.Errorf("%d items at %d a second take %v, past the request's %v: raise rate_per_second or select fewer", len(ids), p.rateOf(),
			time.Duration(len(ids)-1)*time.Second/time.Duration(p.rateOf()), RequestTimeout)
	}
	return nil
}

// oneItemAction reads POST .../{id}/{action} on one item (what names it in messages): the
// action, one of allowed (404 otherwise), the id (400 when not a number) and the JSON body
// ActionParams, checked (400). ok is false when it has answered the request itself.
func (h *Handler) oneItemAction(w http.ResponseWriter, r *http.Request, what string, allowed ...string) (action string, id int64, p ActionParams, ok bool) {
	action = r.PathValue("action")
	if !slices.Contains(allowed, action) {
		h.fail(w, r, http.StatusNotFound, fmt.Sprintf("no action %q on %s: %s", action, what, strings.Join(allowed, " or ")))
		return "", 0, p, false
	}
	id, err := pathID(r)
	if err != nil {
		h.fail(w, r, http.StatusBadRequest, err.Error())
		return "", 0, p, false
	}
	if err := decodeJSON(r, &p); err != nil {
		h.fail(w, r, http.StatusBadRequest, "body: "+err.Error())
		return "", 0, p, false
	}
	if err := checkParams(p, []int64{id}); err != nil {
		h.fail(w, r, http.StatusBadRequest, err.Error())
		return "", 0, p, false
	}
	return action, id, p, true
}

// deadLetterAction replays or discards each dead letter of ids.
func (h *Handler) deadLetterAction(ctx context.Context, action string, ids []int64, p ActionParams, actor string) ActionResult {
	res := ActionResult{Action: action, DryRun: p.DryRun, Reason: p.Reason, Actor: actor, Items: []ItemResult{}}
	start, every := time.Now(), time.Second/time.Duration(p.rateOf())
	for i, id := range ids {
		if !p.DryRun && i > 0 { // the rate limit: item i starts no sooner than i/rate after the first
			if wait := time.Until(start.Add(time.Duration(i) * every)); wait > 0 {
				select {
				case <-ctx.Done():
				case <-time.After(wait):
				}
			}
		}
		it := ItemResult{ID: id}
		err := h.inTx(ctx, p.DryRun, func(tx pgx.Tx) error {
			switch action {
			case actReplay:
				row, d, err := dlq.ReplayTx(ctx, tx, h.cfg.Schema, id, dlq.Replay{ToTopic: p.ToTopic, Reason: p.Reason, Actor: actor, Again: p.Again})
				if err == nil {
					it.OutboxRow, it.ToTopic = row, d.Topic
					if p.ToTopic != "" {
						it.ToTopic = p.ToTopic
					}
				}
				return err
			case actDiscard:
				return dlq.DiscardTx(ctx, tx, h.cfg.Schema, id, dlq.Action{Reason: p.Reason, Actor: actor})
			}
			return fmt.Errorf("no action %q on dead letters: replay or discard", action)
		})
		it.NotFound, it.Resolved = errors.Is(err, dlq.ErrNotFound), errors.Is(err, dlq.ErrResolved)
		res.add(it, action+"ed", err)
	}
	h.logAction("dead letters", res)
	return res
}

// outboxAction releases or discards each parked outbox row of ids.
func (h *Handler) outboxAction(ctx context.Context, action string, ids []int64, p ActionParams, actor string) ActionResult {
	res := ActionResult{Action: action, DryRun: p.DryRun, Reason: p.Reason, Actor: actor, Items: []ItemResult{}}
	w := outbox.Writer{Schema: h.cfg.Schema}
	for _, id := range ids {
		it := ItemResult{ID: id}
		err := h.inTx(ctx, p.DryRun, func(tx pgx.Tx) error {
			switch action {
			case actRelease:
				return w.ReleaseTx(ctx, tx, id, p.Reason, actor)
			case actDiscard:
				return w.DiscardTx(ctx, tx, id, p.Reason, actor)
			}
			return fmt.Errorf("no action %q on outbox rows: release or discard", action)
		})
		it.NotFound = errors.Is(err, outbox.ErrNotParked)
		done := "released"
		if action == actDiscard {
			done = "discarded"
		}
		res.add(it, done, err)
	}
	h.logAction("outbox rows", res)
	return res
}

// add records one item's outcome.
func (res *ActionResult) add(it ItemResult, done string, err error) {
	switch {
	case err != nil:
		it.Outcome, it.Error = "refused", err.Error()
		res.Refused++
	case res.DryRun:
		it.OK, it.Outcome = true, "would be "+done
		res.Done++
	default:
		it.OK, it.Outcome = true, done
		res.Done++
	}
	res.Items = append(res.Items, it)
}

// inTx runs f in a transaction, committed unless dryRun (then rolled back).
func (h *Handler) inTx(ctx context.Context, dryRun bool, f func(pgx.Tx) error) error {
	tx, err := h.cfg.Pool.Begin(ctx)
	if err != nil {
		return err
	}
	defer func() { _ = tx.Rollback(context.WithoutCancel(ctx)) }()
	if err := f(tx); err != nil {
		return err
	}
	if dryRun {
		return nil
	}
	return tx.Commit(ctx)
}

func (h *Handler) logAction(what string, res ActionResult) {
	if res.DryRun {
		return
	}
	h.log.Info("console: action", zap.String("on", what), zap.String("action", res.Action), zap.Int("done", res.Done),
		zap.Int("refused", res.Refused), zap.String("actor", res.Actor), zap.String("reason", res.Reason))
}
