package main

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"os"
	"sort"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/kafkatx/kafkatx/idempotency/airflow"
	"github.com/kafkatx/kafkatx/internal/offsets"
	"github.com/kafkatx/kafkatx/internal/offsetstore"
	"github.com/kafkatx/kafkatx/internal/pgerr"
	"github.com/kafkatx/kafkatx/pg"
)

// AirflowCmd groups the commands that compare kafkatx's Airflow ledger with Airflow.
type AirflowCmd struct {
	Status AirflowStatusCmd `cmd:"" help:"Compare the Airflow ledger of a group with Airflow: missing, queued too long, failed. Exit 0 aligned, 3 drift."`
	Repair AirflowRepairCmd `cmd:"" help:"Re-create in Airflow what the ledger holds and Airflow lost, under the same run id or kafkatx_id, exactly once; audited."`
}

// AirflowAccess are the flags that reach Airflow: its URL and one way to authenticate (as
// dagtrigger's). airflow status and repair need them; offsets reset and the console take them
// optionally.
type AirflowAccess struct {
	AirflowURL   string `name:"airflow-url" help:"Base URL of the Airflow API server, http://host:8080."`
	TokenFile    string `name:"airflow-token-file" help:"File holding a bearer token for Airflow, re-read per request."`
	Username     string `name:"airflow-username" help:"Airflow user whose password (--airflow-password-file) is exchanged for a token at POST /auth/token."`
	PasswordFile string `name:"airflow-password-file" help:"File holding --airflow-username's password."`
}

// given reports whether an Airflow URL was given.
func (a *AirflowAccess) given() bool { return a.AirflowURL != "" }

// validate checks the access flags (none given is valid: see given), without quoting the URL
// or a file's content.
func (a *AirflowAccess) validate() error {
	switch {
	case !a.given() && (a.TokenFile != "" || a.Username != "" || a.PasswordFile != ""):
		return errors.New("--airflow-token-file, --airflow-username and --airflow-password-file need --airflow-url")
	case !a.given():
		return nil
	case (a.Username == "") != (a.PasswordFile == ""):
		return errors.New("--airflow-username and --airflow-password-file go together")
	case a.Username != "" && a.TokenFile != "":
		return errors.New("--airflow-token-file excludes --airflow-username and --airflow-password-file: pass one way to authenticate")
	}
	if err := checkAirflowURL(a.AirflowURL); err != nil {
		return err
	}
	for name, path := range map[string]string{"airflow-token-file": a.TokenFile, "airflow-password-file": a.PasswordFile} {
		if path == "" {
			continue
		}
		fh, err := os.Open(path)
		if err != nil {
			return fmt.Errorf("--%s: %w", name, err)
		}
		fh.Close()
	}
	return nil
}

// client returns the Airflow client of the flags.
func (a *AirflowAccess) client(g *Globals) (*airflow.Client, error) {
	return airflow.New(airflow.Config{BaseURL: a.AirflowURL, TokenFile: a.TokenFile, Username: a.Username, PasswordFile: a.PasswordFile,
		Logger: g.logger(), MaxAttempts: 4, RequestTimeout: 30 * time.Second})
}

// AirflowFlags are the flags airflow status and repair share: the group, Airflow and its
// credentials (--airflow-url required), and the ledger rows to compare.
type AirflowFlags struct {
	Group         string `required:"" help:"Consumer group id."`
	AirflowAccess `embed:""`
	Topic         string `help:"Only this topic."`
	Partition     *int32 `help:"Only this partition."`
	From          *int64 `name:"from" help:"Only offsets at or above this one." placeholder:"OFFSET"`
	To            *int64 `name:"to" help:"Only offsets below this one (half-open: [--from, --to))." placeholder:"OFFSET"`
}

// validate checks what kong cannot.
func (f *AirflowFlags) validate() error {
	switch {
	case f.AirflowURL == "":
		return errors.New("--airflow-url is required")
	case f.Partition != nil && *f.Partition < 0:
		return fmt.Errorf("--partition %d: partitions are numbered from 0", *f.Partition)
	case f.From != nil && *f.From < 0:
		return fmt.Errorf("--from %d: offsets are 0 or more", *f.From)
	case f.To != nil && *f.To < 0:
		return fmt.Errorf("--to %d: offsets are 0 or more", *f.To)
	case f.From != nil && f.To != nil && *f.To <= *f.From:
		return fmt.Errorf("--from %d --to %d: an empty range ([from, to) is half-open)", *f.From, *f.To)
	}
	return f.AirflowAccess.validate()
}

// checkAirflowURL refuses an --airflow-url that is not an http(s) URL with a host, without
// quoting it (a URL may carry credentials).
func checkAirflowURL(s string) error {
	if _, err := airflow.New(airflow.Config{BaseURL: s}); err != nil {
		return fmt.Errorf("--airflow-url: %s", strings.TrimPrefix(err.Error(), "airflow: "))
	}
	return nil
}

// filter is the ledger filter of the flags.
func (f *AirflowFlags) filter() airflow.LedgerFilter {
	return airflow.LedgerFilter{Group: f.Group, Topic: f.Topic, Partition: f.Partition, From: f.From, To: f.To}
}

// Kinds of drift between the ledger and Airflow.
const (
	driftMissing = "missing" // Airflow has no such run or asset event (deleted, a restored metastore, the DAG or asset gone)
	driftQueued  = "queued"  // a run queued longer than --queued-for
	driftFailed  = "failed"  // a run that failed
)

// Reasons a run stays queued, when Airflow tells.
const (
	reasonPaused        = "dag_paused"
	reasonMaxActiveRuns = "max_active_runs"
)

// airflowDrift is one ledger entry Airflow does not match: one JSON line of airflow status.
type airflowDrift struct {
	// Shard is the shard whose ledger holds the entry (with --shard; absent unsharded).
	Shard     string     `json:"shard,omitempty"`
	Kind      string     `json:"kind"`
	Group     string     `json:"group"`
	Topic     string     `json:"topic"`
	Partition int32      `json:"partition"`
	Offset    int64      `json:"offset"`
	TopicID   string     `json:"topic_id,omitempty"`
	DAGID     string     `json:"dag_id,omitempty"`
	RunID     string     `json:"run_id,omitempty"`
	Asset     string     `json:"asset,omitempty"`
	KafkatxID string     `json:"kafkatx_id,omitempty"`
	State     string     `json:"state,omitempty"` // Airflow's run state
	QueuedAt  *time.Time `json:"queued_at,omitempty"`
	// Reason is present for kind queued: dag_paused, max_active_runs, or "" when Airflow
	// tells nothing more.
	Reason   *string `json:"reason,omitempty"`
	LedgerID int64   `json:"ledger_id"`

	entry airflow.LedgerEntry
	note  string // a failed run's note
}

// airflowReport is the comparison of a ledger with Airflow.
type airflowReport struct {
	Entries int // distinct runs and asset events in the ledger rows compared
	Runs    int
	Assets  int
	Drift   []airflowDrift
	// Cleared counts the failed runs an operator's skip cleared (see clearedBySkip): not drift.
	Cleared int
	// Sharded: the ledgers of every --shard were compared (each drift names its shard).
	Sharded bool
}

func (r *airflowReport) count(kind string) int {
	n := 0
	for _, d := range r.Drift {
		if d.Kind == kind {
			n++
		}
	}
	return n
}

// assetScanBack is how far before the oldest ledger row of an asset its events are read: an
// event's timestamp precedes its ledger row by the time between the POST and the commit (an
// earlier try's, when the event existed). One hour; an event created longer before its row
// (Airflow failing for longer between the first try and the commit) would be named missing.
const assetScanBack = time.Hour

// compareAirflow compares the ledger entries with Airflow: each distinct run (DAG id, run id)
// and asset event (asset, kafkatx_id) once, at its first row's position. Runs are read a page
// of airflow.PageSize at a time per DAG, newest first, down to the oldest row's time; only
// the runs not met on the pages are read one by one (GET by run id). Asset events are read a
// page at a time per asset from assetScanBack before the oldest row. A run queued for longer
// than queuedFor is drift with its reason; a paused DAG's runs queued for less are aligned.
func compareAirflow(ctx context.Context, c *airflow.Client, entries []airflow.LedgerEntry, queuedFor time.Duration, now time.Time) (*airflowReport, error) {
	rep := &airflowReport{}
	type runKey struct{ dag, run string }
	runs := map[runKey]airflow.LedgerEntry{}
	var dagOrder []string
	byDAG := map[string][]airflow.LedgerEntry{}
	byAsset := map[string][]airflow.LedgerEntry{}
	var assetOrder []string
	seenAsset := map[[2]string]bool{}
	for _, e := range entries {
		switch e.Target {
		case airflow.TargetDAGRun:
			k := runKey{e.DAGID, e.RunID}
			if _, ok := runs[k]; ok {
				continue
			}
			runs[k] = e
			if byDAG[e.DAGID] == nil {
				dagOrder = append(dagOrder, e.DAGID)
			}
			byDAG[e.DAGID] = append(byDAG[e.DAGID], e)
		case airflow.TargetAssetEvent:
			k := [2]string{e.AssetName, e.KafkatxID}
			if seenAsset[k] {
				continue
			}
			seenAsset[k] = true
			if byAsset[e.AssetName] == nil {
				assetOrder = append(assetOrder, e.AssetName)
			}
			byAsset[e.AssetName] = append(byAsset[e.AssetName], e)
		}
	}
	rep.Runs, rep.Assets = len(runs), len(seenAsset)
	rep.Entries = rep.Runs + rep.Assets
	drift := func(kind string, e airflow.LedgerEntry) airflowDrift {
		return airflowDrift{Kind: kind, Group: e.Group, Topic: e.Topic, Partition: e.Partition, Offset: e.Offset, TopicID: e.TopicID,
			DAGID: e.DAGID, RunID: e.RunID, Asset: e.AssetName, KafkatxID: e.KafkatxID, LedgerID: e.ID, entry: e}
	}
	for _, dag := range dagOrder {
		want := map[string]airflow.LedgerEntry{}
		oldest := now
		for _, e := range byDAG[dag] {
			want[e.RunID] = e
			if e.CreatedAt.Before(oldest) {
				oldest = e.CreatedAt
			}
		}
		info, found, err := c.DAG(ctx, dag)
		if err != nil {
			return nil, fmt.Errorf("read DAG %s: %w", dag, err)
		}
		got := map[string]airflow.DAGRunInfo{}
		if found {
			if _, err := c.DAGRuns(ctx, dag, oldest.Add(-airflow.AssetSettleMargin), func(r airflow.DAGRunInfo) bool {
				if _, ok := want[r.RunID]; ok {
					got[r.RunID] = r
				}
				return len(got) < len(want)
			}); err != nil {
				return nil, fmt.Errorf("list runs of DAG %s: %w", dag, err)
			}
			// Runs not met on the pages (created long before their row: a replay) one by one.
			for id := range want {
				if _, ok := got[id]; ok {
					continue
				}
				r, ok, err := c.DAGRun(ctx, dag, id)
				if err != nil {
					return nil, fmt.Errorf("read run %s of DAG %s: %w", id, dag, err)
				}
				if ok {
					got[id] = r
				}
			}
		}
		running := -1
		for _, e := range byDAG[dag] {
			r, ok := got[e.RunID]
			switch {
			case !ok:
				rep.Drift = append(rep.Drift, drift(driftMissing, e))
			case r.State == "failed":
				d := drift(driftFailed, e)
				d.State = r.State
				if r.Note != nil {
					d.note = *r.Note
				}
				rep.Drift = append(rep.Drift, d)
			case r.State == "queued":
				since := r.QueuedAt
				if since == nil {
					since = r.RunAfter
				}
				if since == nil || now.Sub(*since) <= queuedFor {
					continue // queued, within the bound: aligned, paused DAG or not
				}
				reason := ""
				switch {
				case info.IsPaused:
					reason = reasonPaused
				case info.MaxActiveRuns > 0:
					if running < 0 {
						if running, err = c.RunningRuns(ctx, dag); err != nil {
							return nil, fmt.Errorf("count running runs of DAG %s: %w", dag, err)
						}
					}
					if running >= info.MaxActiveRuns {
						reason = reasonMaxActiveRuns
					}
				}
				d := drift(driftQueued, e)
				d.State, d.QueuedAt, d.Reason = r.State, since, &reason
				rep.Drift = append(rep.Drift, d)
			}
		}
	}
	for _, name := range assetOrder {
		oldest := now
		for _, e := range byAsset[name] {
			if e.CreatedAt.Before(oldest) {
				oldest = e.CreatedAt
			}
		}
		have := map[string]bool{}
		id, err := c.AssetID(ctx, name)
		var se *airflow.StatusError
		switch {
		case err != nil && errors.As(err, &se) && se.StatusCode == http.StatusNotFound:
			// No such asset any more (deleted, renamed): every event of it is missing.
		case err != nil:
			return nil, fmt.Errorf("resolve asset %s: %w", name, err)
		default:
			if err := c.AssetEvents(ctx, id, oldest.Add(-assetScanBack), func(ev airflow.AssetEventInfo) bool {
				if k := ev.KafkatxID(); k != "" {
					have[k] = true
				}
				return true
			}); err != nil {
				return nil, fmt.Errorf("list events of asset %s: %w", name, err)
			}
		}
		for _, e := range byAsset[name] {
			if !have[e.KafkatxID] {
				rep.Drift = append(rep.Drift, drift(driftMissing, e))
			}
		}
	}
	sort.SliceStable(rep.Drift, func(i, j int) bool {
		a, b := rep.Drift[i], rep.Drift[j]
		if a.Topic != b.Topic {
			return a.Topic < b.Topic
		}
		if a.Partition != b.Partition {
			return a.Partition < b.Partition
		}
		return a.Offset < b.Offset
	})
	return rep, nil
}

// AirflowStatusCmd compares the Airflow ledger of a group with Airflow.
type AirflowStatusCmd struct {
	AirflowFlags `embed:""`
	QueuedFor    time.Duration `name:"queued-for" default:"10m" help:"A run queued longer than this is drift (kind queued, with the reason when Airflow tells it: dag_paused, max_active_runs)."`
	Output       string        `default:"text" enum:"text,json" help:"text, or json: one object per line for each ledger entry that is not aligned."`
}

// Help is the long help of airflow status.
func (AirflowStatusCmd) Help() string {
	return `Compares the Airflow ledger (every DAG run and asset event a kafkatx consumer such as
examples/dagtrigger handed to Airflow, with its topic, partition and offset) with Airflow's
own tables, through its REST API: each run (DAG id, run id) and asset event (asset,
kafkatx_id) once. Drift kinds:

  missing   Airflow has no such run or asset event (deleted, a metastore restored from an
            older backup, the DAG or asset gone): kafkatx airflow repair re-creates it.
  queued    a run queued longer than --queued-for (default 10m), with a reason: dag_paused
            (the DAG is paused: Airflow accepts runs of a paused DAG and never starts them),
            max_active_runs (the DAG's running runs reach its max_active_runs), or empty. A
            paused DAG's runs queued for less are aligned.
  failed    a run Airflow ran and that failed.

Airflow's lists are read a page of 100 at a time (runs newest first, per DAG; asset events
per asset, from an hour before the oldest row compared), and only runs not met on the pages
are read one by one.

--output json prints one object per line per entry that is not aligned: kind, group, topic,
partition, offset, topic_id, dag_id and run_id (runs) or asset and kafkatx_id (asset events),
state, queued_at and reason (queued), ledger_id.

With --shard NAME=URL ... the ledger of every shard is compared, each drift naming its shard
(a "shard" field first in JSON, a SHARD column in text).

Exit status: 0 aligned, 3 drift, 7 the ledger has no row for the group (and the filters),
2 a usage error, 1 an error (the database or Airflow unreachable, refused credentials).`
}

// Validate checks what kong cannot.
func (c *AirflowStatusCmd) Validate() error {
	if c.QueuedFor <= 0 {
		return fmt.Errorf("--queued-for %v: want a positive duration", c.QueuedFor)
	}
	return c.AirflowFlags.validate()
}

func (c *AirflowStatusCmd) Run(ctx context.Context, g *Globals) error {
	dbs, closeAll, err := g.ledgerDBs(ctx)
	if err != nil {
		return err
	}
	defer closeAll()
	rep, err := airflowCompare(ctx, g, dbs, &c.AirflowFlags, c.QueuedFor)
	if err != nil {
		return err
	}
	return printAirflowStatus(os.Stdout, c.Group, c.Output, rep)
}

// ledgerDBs opens the databases whose ledgers the airflow commands read (shardDBs): --database-url's
// alone, or with --shard every shard in order (the ledger row of an offset is written on the
// shard that held its partition then), each with kafkatx's schema. closeAll closes what was
// opened.
func (g *Globals) ledgerDBs(ctx context.Context) ([]shardDB, func(), error) {
	pool, err := g.pool(ctx)
	if err != nil {
		return nil, nil, err
	}
	if len(g.Shard) == 0 {
		if err := offsetsCheckSchema(ctx, pool, g.Schema); err != nil {
			pool.Close()
			return nil, nil, err
		}
	}
	dbs, closeShards, err := g.shardDBs(ctx, pool, offsetsCheckSchema)
	if err != nil {
		pool.Close()
		return nil, nil, err
	}
	return dbs, func() { closeShards(); pool.Close() }, nil
}

// airflowCompare reads the ledger the flags select on each of dbs and compares it with
// Airflow, shard by shard (each drift names its shard); no row on any of them is exit 7.
func airflowCompare(ctx context.Context, g *Globals, dbs []shardDB, f *AirflowFlags, queuedFor time.Duration) (*airflowReport, error) {
	all := &airflowReport{Sharded: len(g.Shard) > 0}
	var c *airflow.Client
	for _, db := range dbs {
		entries, err := airflow.ReadLedger(ctx, db.pool, g.Schema, f.filter())
		if err != nil {
			if pgerr.IsCode(err, "42P01") {
				return nil, shardErr(db.shard, fmt.Errorf("schema %q has no Airflow ledger: run `kafkatx migrate up --schema %s` first", g.Schema, shellQuote(g.Schema)))
			}
			return nil, shardErr(db.shard, err)
		}
		if len(entries) == 0 {
			continue
		}
		if c == nil {
			if c, err = f.client(g); err != nil {
				return nil, err
			}
		}
		rep, err := compareAirflow(ctx, c, entries, queuedFor, time.Now())
		if err != nil {
			return nil, shardErr(db.shard, err)
		}
		if err := clearedBySkip(ctx, db.pool, g.Schema, f.Group, rep); err != nil {
			return nil, shardErr(db.shard, err)
		}
		for i := range rep.Drift {
			rep.Drift[i].Shard = db.shard
		}
		all.Entries += rep.Entries
		all.Runs += rep.Runs
		all.Assets += rep.Assets
		all.Cleared += rep.Cleared
		all.Drift = append(all.Drift, rep.Drift...)
	}
	if all.Entries == 0 {
		return nil, &exitError{code: offsetsExitUnknown, err: fmt.Errorf("the Airflow ledger has no row for group %s%s%s: nothing was handed to Airflow (or retention removed it)",
			termText(f.Group), map[bool]string{true: " in the range given", false: ""}[f.Topic != "" || f.Partition != nil || f.From != nil || f.To != nil],
			map[bool]string{true: " on any shard", false: ""}[len(g.Shard) > 0])}
	}
	return all, nil
}

// printAirflowStatus prints rep as text or JSON lines and returns exit 3 on drift.
func printAirflowStatus(w io.Writer, group, output string, rep *airflowReport) error {
	if output == "json" {
		enc := json.NewEncoder(w)
		for _, d := range rep.Drift {
			if err := enc.Encode(d); err != nil {
				return err
			}
		}
	} else {
		if len(rep.Drift) > 0 {
			tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)
			if rep.Sharded {
				fmt.Fprint(tw, "SHARD\t")
			}
			fmt.Fprintln(tw, "KIND\tTOPIC\tPARTITION\tOFFSET\tTARGET\tSTATE\tREASON")
			for _, d := range rep.Drift {
				if rep.Sharded {
					fmt.Fprintf(tw, "%s\t", orDash(termText(d.Shard)))
				}
				target := termText(d.DAGID) + " run " + termText(d.RunID)
				if d.Asset != "" {
					target = "asset " + termText(d.Asset) + " kafkatx_id " + termText(d.KafkatxID)
				}
				reason := "-"
				if d.Reason != nil && *d.Reason != "" {
					reason = *d.Reason
				}
				state := d.State
				if state == "" {
					state = "-"
				}
				fmt.Fprintf(tw, "%s\t%s\t%d\t%d\t%s\t%s\t%s\n", d.Kind, termText(d.Topic), d.Partition, d.Offset, target, termText(state), reason)
			}
			if err := tw.Flush(); err != nil {
				return err
			}
			hint := ""
			if rep.count(driftMissing) > 0 {
				hint = "; `kafkatx airflow repair` re-creates the missing ones"
			}
			if rep.count(driftQueued) > 0 {
				hint += "; queued runs wait on Airflow (the reason column), `offsets reset --mode skip --clear-airflow` clears a skipped range's"
			}
			fmt.Fprintf(w, "DRIFT for group %s: %d missing, %d queued, %d failed of %d ledger entries (%d runs, %d asset events)%s\n",
				termText(group), rep.count(driftMissing), rep.count(driftQueued), rep.count(driftFailed), rep.Entries, rep.Runs, rep.Assets, hint)
		} else {
			cleared := ""
			if rep.Cleared > 0 {
				cleared = fmt.Sprintf("; %d runs marked failed by an operator's skip (airflow_clear)", rep.Cleared)
			}
			fmt.Fprintf(w, "aligned: %d ledger entries of group %s (%d runs, %d asset events) match Airflow%s\n", rep.Entries, termText(group), rep.Runs, rep.Assets, cleared)
		}
	}
	if len(rep.Drift) > 0 {
		return &exitError{code: offsetsExitDrift}
	}
	return nil
}

// AirflowRepairCmd re-creates in Airflow what the ledger holds and Airflow lost.
type AirflowRepairCmd struct {
	AirflowFlags `embed:""`
	Reason       string `required:"" help:"Why, for the offset audit."`
	DryRun       bool   `name:"dry-run" help:"Print what would be re-created; change nothing."`
}

// Help is the long help of airflow repair.
func (AirflowRepairCmd) Help() string {
	return `Compares the ledger with Airflow as kafkatx airflow status does and re-creates each entry
Airflow is missing: a DAG run under its run id with the conf the ledger kept, an asset event
with the same extra (its kafkatx_id) on the same asset. Exactly once: a run id Airflow already
has answers 409 and creates nothing, and an asset event is posted only after a read of the
asset's events finds none with its kafkatx_id, so a repair run twice creates nothing the second
time. The ledger keeps a payload (conf or extra) of at most 64 KiB of JSON; an entry whose
payload was larger is named and left (replay its offset with kafkatx offsets reset --mode
replay after the idempotency key expired, or re-create it by hand). Queued and failed runs
are reported, not changed.

Each partition repaired gets one offset audit row of kind airflow_repair: the range of its
offsets re-created [first, last+1), the actor (the OS user at the host), the reason and the
counts (with --shard, on the shard whose ledger holds the entries). --dry-run prints the plan
and changes nothing.

Exit status: 0 done (or nothing to do), 2 a usage error (an empty --reason among them), 1 an
error or an entry that could not be re-created.`
}

// Validate checks what kong cannot.
func (c *AirflowRepairCmd) Validate() error {
	if strings.TrimSpace(c.Reason) == "" {
		return errors.New("--reason is empty: say why (it is recorded in the offset audit)")
	}
	return c.AirflowFlags.validate()
}

func (c *AirflowRepairCmd) Run(ctx context.Context, g *Globals) error {
	dbs, closeAll, err := g.ledgerDBs(ctx)
	if err != nil {
		return err
	}
	defer closeAll()
	rep, err := airflowCompare(ctx, g, dbs, &c.AirflowFlags, 24*365*time.Hour)
	if err != nil {
		return err
	}
	client, err := c.client(g)
	if err != nil {
		return err
	}
	res, err := repairAirflow(ctx, client, rep, c.DryRun, os.Stdout)
	if err != nil {
		return err
	}
	if !c.DryRun {
		store := offsetstore.New(pg.SchemaOr(g.Schema))
		actor := offsets.Actor()
		pools := map[string]*pgxpool.Pool{}
		for _, db := range dbs {
			pools[db.shard] = db.pool
		}
		for _, p := range res.partitions() {
			// The audit row goes where the ledger row was read: the partition's shard.
			pool := pools[p.shard]
			e := offsetstore.Event{Group: c.Group, Topic: p.topic, Partition: p.partition, Kind: offsetstore.KindAirflowRepair,
				From: p.from, To: p.to, Actor: actor,
				Reason: fmt.Sprintf("%s (re-created in Airflow: %d runs, %d asset events)", c.Reason, p.runs, p.assets)}
			if _, err := store.InsertEvent(ctx, pool, e); err != nil {
				return shardErr(p.shard, err)
			}
		}
	}
	verb := "re-created"
	if c.DryRun {
		verb = "would re-create (dry run)"
	}
	fmt.Printf("%s %d of %d missing (%d runs, %d asset events); %d already back in Airflow; %d not re-creatable; %d queued and %d failed left as they are\n",
		verb, res.created, rep.count(driftMissing), res.runs, res.assets, res.existed, len(res.failed), rep.count(driftQueued), rep.count(driftFailed))
	if len(res.failed) > 0 {
		return fmt.Errorf("%d missing entries could not be re-created: %s", len(res.failed), strings.Join(res.failed, "; "))
	}
	return nil
}

// repairResult is what a repair did.
type repairResult struct {
	created, runs, assets, existed int
	failed                         []string
	done                           []airflowDrift
}

type repairedPartition struct {
	shard        string
	topic        string
	partition    int32
	from, to     int64
	runs, assets int
}

// partitions returns the repaired entries per partition: the offset range and the counts.
func (r *repairResult) partitions() []repairedPartition {
	var out []repairedPartition
	idx := map[string]int{}
	for _, d := range r.done {
		k := fmt.Sprintf("%s\x00%s\x00%d", d.Shard, d.Topic, d.Partition)
		i, ok := idx[k]
		if !ok {
			i = len(out)
			idx[k] = i
			out = append(out, repairedPartition{shard: d.Shard, topic: d.Topic, partition: d.Partition, from: d.Offset, to: d.Offset + 1})
		}
		p := &out[i]
		p.from, p.to = min(p.from, d.Offset), max(p.to, d.Offset+1)
		if d.Asset != "" {
			p.assets++
		} else {
			p.runs++
		}
	}
	return out
}

// repairAirflow re-creates each missing entry of rep (or only prints it when dryRun).
func repairAirflow(ctx context.Context, c *airflow.Client, rep *airflowReport, dryRun bool, w io.Writer) (*repairResult, error) {
	res := &repairResult{}
	for _, d := range rep.Drift {
		if d.Kind != driftMissing {
			continue
		}
		e := d.entry
		where := fmt.Sprintf("%s[%d]@%d", termText(e.Topic), e.Partition, e.Offset)
		if d.Shard != "" {
			where = "shard " + termText(d.Shard) + " " + where
		}
		what := "run " + termText(e.DAGID) + "/" + termText(e.RunID)
		if e.Target == airflow.TargetAssetEvent {
			what = "asset event on " + termText(e.AssetName) + " kafkatx_id " + termText(e.KafkatxID)
		}
		if e.Payload == nil && e.PayloadBytes > 0 {
			res.failed = append(res.failed, fmt.Sprintf("%s %s: its payload of %d bytes was over the ledger's %d and not kept", what, where, e.PayloadBytes, airflow.MaxLedgerPayloadBytes))
			continue
		}
		if dryRun {
			fmt.Fprintf(w, "would re-create %s (%s)\n", what, where)
			res.created++
			res.count(e)
			continue
		}
		created := false
		switch e.Target {
		case airflow.TargetDAGRun:
			var conf any
			if e.Payload != nil {
				conf = e.Payload
			}
			r, err := c.TriggerDAGRun(ctx, airflow.Trigger{DAGID: e.DAGID, RunID: e.RunID, Conf: conf})
			if err != nil {
				res.failed = append(res.failed, fmt.Sprintf("%s %s: %v", what, where, err))
				continue
			}
			created = r.Created
		case airflow.TargetAssetEvent:
			var extra any
			if e.Payload != nil {
				extra = e.Payload
			}
			// A read-back first: a repair running at the same time (or just before) created it.
			r, err := c.CreateAssetEvent(ctx, airflow.AssetEvent{Asset: e.AssetName, KafkatxID: e.KafkatxID, Extra: extra, MaybeSentSince: time.Now()})
			if err != nil {
				res.failed = append(res.failed, fmt.Sprintf("%s %s: %v", what, where, err))
				continue
			}
			created = r.Created
		}
		if !created {
			res.existed++
			fmt.Fprintf(w, "%s (%s) is back in Airflow already: nothing created\n", what, where)
			continue
		}
		res.created++
		res.count(e)
		res.done = append(res.done, d)
		fmt.Fprintf(w, "re-created %s (%s)\n", what, where)
	}
	return res, nil
}

func (r *repairResult) count(e airflow.LedgerEntry) {
	if e.Target == airflow.TargetAssetEvent {
		r.assets++
	} else {
		r.runs++
	}
}
