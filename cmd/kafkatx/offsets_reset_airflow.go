package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net/http"
	"sort"
	"strings"
	"time"

	"github.com/kafkatx/kafkatx/idempotency/airflow"
	"github.com/kafkatx/kafkatx/internal/offsets"
	"github.com/kafkatx/kafkatx/internal/offsetstore"
	"github.com/kafkatx/kafkatx/internal/pgerr"
	"github.com/kafkatx/kafkatx/pg"
)

// clearNotePrefix starts the note of every run `offsets reset --mode skip --clear-airflow`
// marks failed; airflow status counts such a run, at an offset an airflow_clear audit row
// covers, as cleared rather than as failed drift.
const clearNotePrefix = "kafkatx: cleared with an operator skip"

// skipNeighbourhood is, for one partition of a skip, the Airflow ledger rows the skip touches:
// those of the skipped range [start, to) (rows of an earlier replay epoch) and of the before
// offsets below it, [from, start). Its runs and asset queues are read from Airflow when the
// reset has Airflow access.
type skipNeighbourhood struct {
	tp              offsetstore.TP
	from, start, to int64
	entries         []airflow.LedgerEntry
	runs            []skipRun
	assets          []skipAsset
	read            bool  // Airflow was read
	auditID         int64 // the operator_skip row the reset wrote for the partition (0: none)
}

// skipRun is a distinct run (DAG id, run id) of a neighbourhood and its state in Airflow
// ("" not read, "missing" Airflow has no such run).
type skipRun struct {
	e     airflow.LedgerEntry
	state string
}

// skipAsset is an asset whose events a neighbourhood holds, and the queue rows (one per DAG
// waiting on the asset) those events are in: a row created at or before the newest of them.
type skipAsset struct {
	name    string
	id      int64 // 0: no such asset in Airflow any more
	events  []airflow.LedgerEntry
	newest  time.Time
	touched []airflow.QueuedAssetEvent
}

func (n *skipNeighbourhood) queuedRuns() []skipRun {
	var out []skipRun
	for _, r := range n.runs {
		if r.state == "queued" {
			out = append(out, r)
		}
	}
	return out
}

func (n *skipNeighbourhood) queues() int {
	k := 0
	for _, a := range n.assets {
		k += len(a.touched)
	}
	return k
}

// clearable reports whether Airflow holds anything of n a clear would change.
func (n *skipNeighbourhood) clearable() bool { return len(n.queuedRuns()) > 0 || n.queues() > 0 }

// airflowNeighbourhoods reads the ledger rows of each skip step's neighbourhood (and of a step
// already at its target, below the watermark: a clear run again after an interrupted one)
// and, when the reset has Airflow access, their runs' states and the asset queues they are
// in. A schema without the ledger (before migration 014) has none.
func (c *OffsetsResetCmd) airflowNeighbourhoods(ctx context.Context, g *Globals, plan *offsets.Plan) ([]*skipNeighbourhood, error) {
	pool, err := g.pool(ctx)
	if err != nil {
		return nil, err
	}
	defer pool.Close()
	var out []*skipNeighbourhood
	for _, s := range plan.Steps {
		var start, to int64
		switch s.Action {
		case offsets.ActionSkip:
			start, to = s.Watermark, s.Target
		case offsets.ActionNone:
			if s.Watermark <= 0 {
				continue
			}
			start, to = s.Watermark, s.Watermark
			// Run again after an interrupted clear: the skip is applied, so the plan has nothing
			// to do; the neighbourhood is the one the first run planned — below the range that
			// skip moved the watermark over, read from its audit row.
			if skipped, ok, err := offsetstore.New(pg.SchemaOr(g.Schema)).LastSkipTo(ctx, pool, c.Group, s.TP, s.Watermark); err != nil {
				if !pgerr.IsCode(err, "42P01") {
					return nil, err
				}
			} else if ok {
				start = skipped
			}
		default:
			continue
		}
		from := max(0, start-c.AirflowBefore)
		if from == to {
			continue
		}
		p := s.Partition
		entries, err := airflow.ReadLedger(ctx, pool, g.Schema, airflow.LedgerFilter{Group: c.Group, Topic: s.Topic, Partition: &p, From: &from, To: &to})
		if pgerr.IsCode(err, "42P01") {
			return nil, nil // no ledger in this schema
		}
		if err != nil {
			return nil, err
		}
		if len(entries) > 0 {
			out = append(out, &skipNeighbourhood{tp: s.TP, from: from, start: start, to: to, entries: entries})
		}
	}
	if len(out) == 0 || !c.AirflowAccess.given() {
		return out, nil
	}
	client, err := c.AirflowAccess.client(g)
	if err != nil {
		return nil, err
	}
	for _, n := range out {
		if err := readNeighbourhood(ctx, client, n); err != nil {
			return nil, err
		}
	}
	return out, nil
}

// readNeighbourhood reads from Airflow the state of each distinct run of n (the DAG's runs
// listed a page at a time down to the oldest row's time, then the runs not met one by one)
// and the queue rows of each asset n's events are in.
func readNeighbourhood(ctx context.Context, c *airflow.Client, n *skipNeighbourhood) error {
	type runKey struct{ dag, run string }
	seen := map[runKey]bool{}
	byDAG := map[string]map[string]int{} // DAG -> run id -> index in n.runs
	oldest := map[string]time.Time{}
	byAsset := map[string]int{}
	for _, e := range n.entries {
		switch e.Target {
		case airflow.TargetDAGRun:
			k := runKey{e.DAGID, e.RunID}
			if seen[k] {
				continue
			}
			seen[k] = true
			if byDAG[e.DAGID] == nil {
				byDAG[e.DAGID] = map[string]int{}
				oldest[e.DAGID] = e.CreatedAt
			}
			byDAG[e.DAGID][e.RunID] = len(n.runs)
			n.runs = append(n.runs, skipRun{e: e, state: "missing"})
			if e.CreatedAt.Before(oldest[e.DAGID]) {
				oldest[e.DAGID] = e.CreatedAt
			}
		case airflow.TargetAssetEvent:
			i, ok := byAsset[e.AssetName]
			if !ok {
				i = len(n.assets)
				byAsset[e.AssetName] = i
				n.assets = append(n.assets, skipAsset{name: e.AssetName})
			}
			a := &n.assets[i]
			a.events = append(a.events, e)
			if e.CreatedAt.After(a.newest) {
				a.newest = e.CreatedAt
			}
		}
	}
	dags := make([]string, 0, len(byDAG))
	for d := range byDAG {
		dags = append(dags, d)
	}
	sort.Strings(dags)
	for _, dag := range dags {
		want := byDAG[dag]
		met := map[string]bool{}
		if _, err := c.DAGRuns(ctx, dag, oldest[dag].Add(-airflow.AssetSettleMargin), func(r airflow.DAGRunInfo) bool {
			if i, ok := want[r.RunID]; ok && !met[r.RunID] {
				met[r.RunID] = true
				n.runs[i].state = r.State
			}
			return len(met) < len(want)
		}); err != nil {
			return fmt.Errorf("list runs of DAG %s: %w", dag, err)
		}
		for id, i := range want {
			if met[id] {
				continue
			}
			r, ok, err := c.DAGRun(ctx, dag, id)
			if err != nil {
				return fmt.Errorf("read run %s of DAG %s: %w", id, dag, err)
			}
			if ok {
				n.runs[i].state = r.State
			}
		}
	}
	for i := range n.assets {
		a := &n.assets[i]
		id, err := c.AssetID(ctx, a.name)
		var se *airflow.StatusError
		switch {
		case err != nil && errors.As(err, &se) && se.StatusCode == http.StatusNotFound:
			continue // the asset is gone: nothing of it is queued
		case err != nil:
			return fmt.Errorf("resolve asset %s: %w", a.name, err)
		}
		a.id = id
		queued, err := c.QueuedAssetEvents(ctx, id)
		if err != nil {
			return fmt.Errorf("read the queue of asset %s: %w", a.name, err)
		}
		for _, q := range queued {
			if !q.CreatedAt.After(a.newest) {
				a.touched = append(a.touched, q)
			}
		}
	}
	n.read = true
	return nil
}

// printNeighbourhoods prints what the skip touches in Airflow: per partition, the ledger
// rows, and with Airflow read the runs per state and the asset queues a clear deletes.
func (c *OffsetsResetCmd) printNeighbourhoods(w io.Writer, ns []*skipNeighbourhood) {
	for _, n := range ns {
		runs, assets := 0, 0
		for _, e := range n.entries {
			if e.Target == airflow.TargetAssetEvent {
				assets++
			} else {
				runs++
			}
		}
		where := fmt.Sprintf("the skipped range [%d, %d) and the %d offsets below it", n.start, n.to, n.start-n.from)
		if n.start == n.to {
			where = fmt.Sprintf("the %d offsets below the watermark %d", n.start-n.from, n.start)
		}
		fmt.Fprintf(w, "  airflow ledger %s: %d rows at offsets [%d, %d) (%s): %d runs, %d asset events\n", n.tp, len(n.entries), n.from, n.to, where, runs, assets)
		if !n.read {
			fmt.Fprintf(w, "    their state in Airflow was not read: pass --airflow-url with --airflow-username and --airflow-password-file (or --airflow-token-file) to see it, and --clear-airflow --execute to clear what is still queued\n")
			continue
		}
		states := map[string]int{}
		for _, r := range n.runs {
			states[r.state]++
		}
		if len(n.runs) > 0 {
			var parts []string
			for _, st := range []string{"queued", "running", "success", "failed", "missing"} {
				if states[st] > 0 {
					parts = append(parts, fmt.Sprintf("%d %s", states[st], st))
					delete(states, st)
				}
			}
			for st, k := range states {
				parts = append(parts, fmt.Sprintf("%d %s", k, termText(st)))
			}
			fmt.Fprintf(w, "    runs in Airflow: %s\n", strings.Join(parts, ", "))
		}
		verb := "would be marked failed (--clear-airflow)"
		if c.ClearAirflow && c.Execute {
			verb = "to be marked failed"
		}
		for _, r := range n.queuedRuns() {
			fmt.Fprintf(w, "    queued run %s/%s (offset %d): %s\n", termText(r.e.DAGID), termText(r.e.RunID), r.e.Offset, verb)
		}
		for _, a := range n.assets {
			if a.id == 0 {
				fmt.Fprintf(w, "    asset %s: %d events in the ledger; Airflow has no such asset\n", termText(a.name), len(a.events))
				continue
			}
			if len(a.touched) == 0 {
				fmt.Fprintf(w, "    asset %s: %d events in the ledger; no DAG waits on them (no queue row)\n", termText(a.name), len(a.events))
			}
			for _, q := range a.touched {
				what := "its queue row would be deleted (--clear-airflow)"
				if c.ClearAirflow && c.Execute {
					what = "its queue row to be deleted"
				}
				fmt.Fprintf(w, "    asset %s: DAG %s waits on its events queued since %s (%d of this range's in the ledger): %s\n",
					termText(a.name), termText(q.DAGID), q.CreatedAt.UTC().Format(time.RFC3339), len(a.events), what)
			}
		}
	}
}

// clearNeighbourhoods marks each still-queued run of ns failed with a note naming the skip, and
// deletes each asset queue row ns's events are in, then writes one airflow_clear audit row per
// partition that had anything cleared: the range read, the actor, the reason and what was
// cleared. A run no longer queued when read again is left. It returns the error of the first
// Airflow call that failed, after auditing what was cleared before it.
func (c *OffsetsResetCmd) clearNeighbourhoods(ctx context.Context, g *Globals, ns []*skipNeighbourhood, w io.Writer) error {
	client, err := c.AirflowAccess.client(g)
	if err != nil {
		return err
	}
	pool, err := g.pool(ctx)
	if err != nil {
		return err
	}
	defer pool.Close()
	return c.clearInAirflow(ctx, client, pool, g.Schema, ns, w)
}

// clearInAirflow is clearNeighbourhoods with its Airflow client and database.
func (c *OffsetsResetCmd) clearInAirflow(ctx context.Context, client *airflow.Client, q pg.Querier, schema string, ns []*skipNeighbourhood, w io.Writer) error {
	store := offsetstore.New(pg.SchemaOr(schema))
	actor := offsets.Actor()
	var firstErr error
	for _, n := range ns {
		if !n.clearable() {
			continue
		}
		var marked, queues []string
		lo, hi := int64(-1), int64(-1)
		cover := func(off int64) {
			if lo < 0 || off < lo {
				lo = off
			}
			hi = max(hi, off+1)
		}
		audit := "no operator_skip row"
		if n.auditID != 0 {
			audit = fmt.Sprintf("operator_skip audit row %d", n.auditID)
		}
		note := fmt.Sprintf("%s (group %s, %s, %s, by %s): %s", clearNotePrefix, c.Group, n.tp, audit, actor, c.Reason)
		for _, r := range n.queuedRuns() {
			if firstErr != nil {
				break
			}
			// Read again: a run that started since the plan is not failed by the clear.
			cur, ok, err := client.DAGRun(ctx, r.e.DAGID, r.e.RunID)
			if err != nil {
				firstErr = fmt.Errorf("read run %s of DAG %s: %w", r.e.RunID, r.e.DAGID, err)
				break
			}
			if !ok || cur.State != "queued" {
				fmt.Fprintf(w, "  %s: run %s/%s is no longer queued (%s): left as it is\n", n.tp, termText(r.e.DAGID), termText(r.e.RunID), termText(map[bool]string{true: cur.State, false: "missing"}[ok]))
				continue
			}
			if _, _, err := client.MarkRunFailed(ctx, r.e.DAGID, r.e.RunID, note); err != nil {
				firstErr = fmt.Errorf("mark run %s of DAG %s failed: %w", r.e.RunID, r.e.DAGID, err)
				break
			}
			marked = append(marked, r.e.DAGID+"/"+r.e.RunID)
			cover(r.e.Offset)
			fmt.Fprintf(w, "  %s: run %s/%s (offset %d) marked failed\n", n.tp, termText(r.e.DAGID), termText(r.e.RunID), r.e.Offset)
		}
		for _, a := range n.assets {
			for _, q := range a.touched {
				if firstErr != nil {
					break
				}
				deleted, err := client.DeleteQueuedAssetEvents(ctx, q.DAGID, a.id)
				if err != nil {
					firstErr = fmt.Errorf("delete the queue of asset %s for DAG %s: %w", a.name, q.DAGID, err)
					break
				}
				if !deleted {
					fmt.Fprintf(w, "  %s: asset %s: DAG %s no longer waits (its queue row is gone)\n", n.tp, termText(a.name), termText(q.DAGID))
					continue
				}
				queues = append(queues, a.name+" for DAG "+q.DAGID)
				for _, e := range a.events {
					cover(e.Offset)
				}
				fmt.Fprintf(w, "  %s: asset %s: the queue row of DAG %s deleted\n", n.tp, termText(a.name), termText(q.DAGID))
			}
		}
		if len(marked)+len(queues) == 0 {
			continue
		}
		e := offsetstore.Event{Group: c.Group, Topic: n.tp.Topic, Partition: n.tp.Partition, Kind: offsetstore.KindAirflowClear,
			From: lo, To: hi, Actor: actor, Reason: clearAuditReason(c.Reason, audit, marked, queues)}
		id, err := store.InsertEvent(ctx, q, e)
		if err != nil {
			return errors.Join(firstErr, err)
		}
		fmt.Fprintf(w, "%s: cleared in Airflow: %d queued runs marked failed, %d asset queue rows deleted, audit row %d\n", n.tp, len(marked), len(queues), id)
	}
	if firstErr != nil {
		return fmt.Errorf("the skip is applied but the Airflow clear stopped: %w (run the same command again to clear the rest)", firstErr)
	}
	return nil
}

// clearAuditReason is the reason of an airflow_clear audit row: the operator's reason, the
// skip's audit row, and what was cleared (at most 20 names of each kind, then a count).
func clearAuditReason(reason, audit string, marked, queues []string) string {
	list := func(names []string) string {
		if len(names) > 20 {
			return strings.Join(names[:20], ", ") + fmt.Sprintf(" and %d more", len(names)-20)
		}
		return strings.Join(names, ", ")
	}
	var parts []string
	if len(marked) > 0 {
		parts = append(parts, fmt.Sprintf("%d queued runs marked failed: %s", len(marked), list(marked)))
	}
	if len(queues) > 0 {
		parts = append(parts, fmt.Sprintf("%d asset queue rows deleted: %s", len(queues), list(queues)))
	}
	return fmt.Sprintf("%s (cleared in Airflow with the skip, %s: %s)", reason, audit, strings.Join(parts, "; "))
}

// clearedBySkip takes out of rep's drift each failed run an operator's skip cleared — its
// note starts with clearNotePrefix and an airflow_clear audit row of its partition covers its
// offset — and counts it in rep.Cleared instead: it failed because an operator said so, on
// the record. A failed run with such a note and no audit row stays drift.
func clearedBySkip(ctx context.Context, q pg.Querier, schema, group string, rep *airflowReport) error {
	var candidates bool
	for _, d := range rep.Drift {
		if d.Kind == driftFailed && strings.HasPrefix(d.note, clearNotePrefix) {
			candidates = true
		}
	}
	if !candidates {
		return nil
	}
	events, err := offsetstore.New(pg.SchemaOr(schema)).Events(ctx, q, group, "")
	if err != nil {
		return err
	}
	covered := func(d airflowDrift) bool {
		for _, e := range events {
			if e.Kind == offsetstore.KindAirflowClear && e.Topic == d.Topic && e.Partition == d.Partition && e.From <= d.Offset && d.Offset < e.To {
				return true
			}
		}
		return false
	}
	kept := rep.Drift[:0]
	for _, d := range rep.Drift {
		if d.Kind == driftFailed && strings.HasPrefix(d.note, clearNotePrefix) && covered(d) {
			rep.Cleared++
			continue
		}
		kept = append(kept, d)
	}
	rep.Drift = kept
	return nil
}
