package main

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"os/exec"
	"runtime"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/confluentinc/confluent-kafka-go/v2/kafka"
	"github.com/jackc/pgx/v5/pgxpool"
)

// row is one line of the table: a phase (or a ceiling variant) and its figures.
type row struct {
	Name         string  `json:"name"`
	Kind         string  `json:"kind"` // ceiling, naive, kafkatx, relay
	Batch        int     `json:"batch"`
	Messages     int64   `json:"messages"`
	Rate         float64 `json:"msgs_per_s"`
	DrainSeconds float64 `json:"drain_s"`
	StartupSec   float64 `json:"startup_s,omitempty"` // child start to first commit (group join)
	Offered      float64 `json:"offered_per_s,omitempty"`
	LatencyN     int     `json:"latency_n,omitempty"`
	P50          float64 `json:"p50_ms"`
	P99          float64 `json:"p99_ms"`
	MaxMs        float64 `json:"max_ms,omitempty"`
	PeakRSSMB    float64 `json:"peak_rss_mb"`
	GoSysMB      float64 `json:"go_sys_mb,omitempty"`
	ProcCPU      float64 `json:"proc_cpu_s"`                   // the phase's process, until drained
	PGCPU        float64 `json:"pg_cpu_s"`                     // its PostgreSQL backends, until drained
	BrokerCPU    float64 `json:"broker_cpu_s,omitempty"`       // the broker process, during the phase until drained
	PGServerCPU  float64 `json:"pg_server_cpu_s,omitempty"`    // the whole PostgreSQL server (autovacuum, WAL writer, ... included), same span
	MachineBusy  float64 `json:"machine_busy_cores,omitempty"` // the machine's busy CPUs (everyone's), same span, in cores
	PhaseSec     float64 `json:"phase_s,omitempty"`            // that span: child start to drained
	Batches      int64   `json:"batches,omitempty"`            // kafkatx: batch transactions in the drain
	BatchSec     float64 `json:"batch_tx_s,omitempty"`         // kafkatx: their summed duration
	Load1        float64 `json:"load1"`
	VsCeiling    float64 `json:"vs_ceiling,omitempty"`
	VsCeiling05  float64 `json:"vs_ceiling_05,omitempty"`
	VsNaive      float64 `json:"vs_naive,omitempty"`
	Note         string  `json:"note,omitempty"`

	// Pipeline phases (kind pipeline, soak): examples/orders' settings, relay in-process.
	Events      bool        `json:"events,omitempty"`              // one event per applied order
	VsDrain     float64     `json:"vs_drain,omitempty"`            // e2e: msgs/s over orders-noevents' of this run
	AppliedSec  float64     `json:"applied_s,omitempty"`           // e2e: first commit to the last order applied
	PeakBacklog int64       `json:"outbox_peak_backlog,omitempty"` // e2e: most orders committed, not yet published
	PubN        int         `json:"published_latency_n,omitempty"` // events of stamped orders read back
	PubP50      float64     `json:"published_p50_ms,omitempty"`    // produce -> event's broker append time
	PubP99      float64     `json:"published_p99_ms,omitempty"`    //
	PubMax      float64     `json:"published_max_ms,omitempty"`    //
	Relay       *relaySteps `json:"relay,omitempty"`               // e2e: the relay's rounds, step by step
}

func (r *row) fromDrain(e event) {
	r.Messages, r.Rate, r.DrainSeconds, r.StartupSec = e.Messages, e.Rate, e.Seconds, e.StartupSec
	r.ProcCPU, r.PGCPU, r.GoSysMB = e.ProcCPU, e.PGCPU, e.GoHeapMB
	r.Batches, r.BatchSec = e.Batches, e.BatchSec
	r.Relay = e.Relay
}

func (r *row) fromResult(e event) {
	r.LatencyN, r.P50, r.P99, r.MaxMs = e.Latency, e.P50, e.P99, e.MaxMs
}

// report is the run's output: the machine, the services' settings and the rows.
type report struct {
	Bench        string            `json:"bench"`
	Started      time.Time         `json:"started"`
	Seconds      float64           `json:"seconds"`
	NProc        int               `json:"nproc"`
	CPU          string            `json:"cpu"`
	MemMB        int               `json:"mem_mb"`
	GoVersion    string            `json:"go"`
	Commit       string            `json:"commit,omitempty"`
	Modified     []string          `json:"modified,omitempty"` // tracked Go files changed since Commit (git status)
	KafkaVersion string            `json:"kafka_version"`
	Librdkafka   string            `json:"librdkafka"`
	Postgres     map[string]string `json:"postgres"`
	Partitions   int               `json:"partitions"`
	LoadStart    [3]float64        `json:"load_start"`
	LoadEnd      [3]float64        `json:"load_end"`
	Rows         []row             `json:"phases"`
	Ceiling      float64           `json:"ceiling_msgs_per_s"`    // best "handler" ceiling
	Ceiling05    float64           `json:"ceiling_05_msgs_per_s"` // 05-throughput's SQL, 100 per tx
	Naive        float64           `json:"naive_msgs_per_s"`
	Goals        []goal            `json:"goals"`
	Soak         *soakReport       `json:"soak,omitempty"`
	Scale        []scaleRow        `json:"scale,omitempty"`
}

type goal struct {
	Goal   string  `json:"goal"`
	Figure float64 `json:"figure"`
	Met    bool    `json:"met"`
	Row    string  `json:"row,omitempty"`
}

func newReport(ctx context.Context, base *pgxpool.Pool, o options) *report {
	r := &report{Bench: "kafkatx", Started: time.Now().UTC(), NProc: runtime.NumCPU(), CPU: cpuModel(), MemMB: memTotalMB(),
		GoVersion: runtime.Version(), Partitions: o.partitions, LoadStart: loadAvg(), Postgres: map[string]string{}}
	_, r.Librdkafka = kafka.LibraryVersion()
	if out, err := exec.Command("git", "rev-parse", "--short", "HEAD").Output(); err == nil {
		r.Commit = strings.TrimSpace(string(out))
	}
	// Figures belong to the code that ran: name the tracked Go files that differ from Commit.
	if out, err := exec.Command("git", "status", "--porcelain", "--untracked-files=no").Output(); err == nil {
		for _, l := range strings.Split(string(out), "\n") {
			if f := strings.Fields(l); len(f) >= 2 && strings.HasSuffix(f[len(f)-1], ".go") {
				r.Modified = append(r.Modified, f[len(f)-1])
			}
		}
	}
	rows, err := base.Query(ctx, `SELECT name, current_setting(name) FROM pg_settings
		WHERE name IN ('server_version', 'fsync', 'synchronous_commit', 'full_page_writes', 'wal_level', 'shared_buffers',
		               'max_wal_size', 'commit_delay', 'wal_sync_method', 'max_connections', 'checkpoint_timeout')`)
	if err == nil {
		for rows.Next() {
			var k, v string
			if rows.Scan(&k, &v) == nil {
				r.Postgres[k] = v
			}
		}
		rows.Close()
	}
	return r
}

func (r *report) add(x row) { r.Rows = append(r.Rows, x) }

// finish computes the ceilings, the ratios and the goals of issues 6 and 17.
func (r *report) finish() {
	r.LoadEnd = loadAvg()
	r.Seconds = time.Since(r.Started).Seconds()
	for _, x := range r.Rows {
		switch {
		case x.Kind == "ceiling" && strings.HasPrefix(x.Name, "pg ceiling handler "):
			r.Ceiling = max(r.Ceiling, x.Rate)
		case x.Kind == "ceiling" && x.Name == "pg ceiling sql 100":
			r.Ceiling05 = x.Rate
		case x.Kind == "naive":
			r.Naive = x.Rate
		}
	}
	var best *row
	for i := range r.Rows {
		x := &r.Rows[i]
		if x.Kind != "kafkatx" && x.Kind != "pipeline" {
			continue
		}
		if r.Ceiling > 0 {
			x.VsCeiling = x.Rate / r.Ceiling
		}
		if r.Ceiling05 > 0 {
			x.VsCeiling05 = x.Rate / r.Ceiling05
		}
		if r.Naive > 0 {
			x.VsNaive = x.Rate / r.Naive
		}
		if x.Kind == "kafkatx" && x.Messages < 1_000_000 && (best == nil || x.Rate > best.Rate) {
			best = x
		}
	}
	r.Goals = nil
	if best != nil && r.Ceiling > 0 {
		r.Goals = append(r.Goals, goal{Goal: "exactly-once >= 0.7 x PostgreSQL ceiling (same writes)", Figure: round3(best.VsCeiling), Met: best.VsCeiling >= 0.7, Row: best.Name})
	}
	if best != nil && r.Naive > 0 {
		r.Goals = append(r.Goals, goal{Goal: "exactly-once >= 20 x naive loop", Figure: round3(best.VsNaive), Met: best.VsNaive >= 20, Row: best.Name})
	}
	// Issue 17's goals: the whole pipeline.
	for _, x := range r.Rows {
		if x.Kind == "pipeline" && x.VsDrain > 0 {
			r.Goals = append(r.Goals, goal{Goal: "end to end >= 0.6 x drain without events", Figure: round3(x.VsDrain), Met: x.VsDrain >= 0.6, Row: x.Name})
		}
		if x.Kind == "pipeline" && x.Events && x.Offered >= 10000 && x.LatencyN > 0 {
			r.Goals = append(r.Goals, goal{Goal: "p99 produce->effect <= 100 ms at 10000/s, relay on", Figure: x.P99, Met: x.P99 <= 100, Row: x.Name},
				goal{Goal: "p99 produce->published <= 250 ms at 10000/s", Figure: x.PubP99, Met: x.PubN > 0 && x.PubP99 <= 250, Row: x.Name})
		}
		if x.Kind == "pipeline" && x.Events && x.Messages >= 1_000_000 {
			r.Goals = append(r.Goals, goal{Goal: "peak RSS <= 200 MB, 1,000,000 with events", Figure: x.PeakRSSMB, Met: x.PeakRSSMB <= 200, Row: x.Name})
		}
		if x.Kind == "soak" && r.Soak != nil {
			r.Goals = append(r.Goals, goal{Goal: "soak: peak RSS <= 200 MB", Figure: r.Soak.PeakRSSMB, Met: r.Soak.PeakRSSMB <= 200, Row: x.Name})
			if g := r.Soak.Summary.RSSGrowth; g > 0 {
				r.Goals = append(r.Goals, goal{Goal: "soak: RSS flat (last third / first third <= 1.1)", Figure: g, Met: g <= 1.1, Row: x.Name})
			}
		}
	}
	for _, x := range r.Rows {
		switch {
		case x.Kind == "relay":
			r.Goals = append(r.Goals, goal{Goal: "relay >= 20000 records/s", Figure: round3(x.Rate), Met: x.Rate >= 20000, Row: x.Name})
		case x.Kind == "kafkatx" && x.Offered >= 5000 && x.LatencyN > 0:
			r.Goals = append(r.Goals, goal{Goal: "p99 <= 250 ms at 5000 msgs/s offered", Figure: x.P99, Met: x.P99 <= 250, Row: x.Name})
		case x.Kind == "kafkatx" && x.Messages >= 1_000_000:
			r.Goals = append(r.Goals, goal{Goal: "peak RSS <= 200 MB draining 1,000,000 messages", Figure: x.PeakRSSMB, Met: x.PeakRSSMB <= 200, Row: x.Name})
		}
	}
}

func round3(f float64) float64 { return float64(int64(f*1000+0.5)) / 1000 }

// print writes the human table, then one JSON line with every figure.
func (r *report) print(w io.Writer) {
	fmt.Fprintf(w, "kafkatx bench: %d CPUs (%s), %d MiB RAM, PostgreSQL %s (fsync=%s, synchronous_commit=%s), Kafka %s (librdkafka %s), %d partitions\n",
		r.NProc, r.CPU, r.MemMB, r.Postgres["server_version"], r.Postgres["fsync"], r.Postgres["synchronous_commit"], r.KafkaVersion, r.Librdkafka, r.Partitions)
	if r.Commit != "" {
		fmt.Fprintf(w, "code: commit %s", r.Commit)
		if len(r.Modified) > 0 {
			fmt.Fprintf(w, " with uncommitted changes to %s", strings.Join(r.Modified, ", "))
		}
		fmt.Fprintln(w)
	}
	fmt.Fprintf(w, "load average %.2f %.2f %.2f at start, %.2f %.2f %.2f at end; %.0fs\n\n",
		r.LoadStart[0], r.LoadStart[1], r.LoadStart[2], r.LoadEnd[0], r.LoadEnd[1], r.LoadEnd[2], r.Seconds)
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', tabwriter.AlignRight)
	fmt.Fprintln(tw, "phase\tmsgs\tmsgs/s\tp50 ms\tp99 ms\tat msgs/s\tpeak RSS MB\tCPU s proc/pg/broker\tload1\tvs ceiling\tvs naive\t")
	for _, x := range r.Rows {
		if x.Kind == "soak" {
			continue // its own table below
		}
		at := "-"
		if x.Offered > 0 {
			at = fmt.Sprintf("%.0f", x.Offered)
		} else if x.Kind == "ceiling" {
			at = "tx"
		}
		lat50, lat99 := fmt.Sprintf("%.1f", x.P50), fmt.Sprintf("%.1f", x.P99)
		if x.P50 == 0 && x.P99 == 0 {
			lat50, lat99 = "-", "-"
		}
		ratio := func(f float64) string {
			if f == 0 {
				return "-"
			}
			return fmt.Sprintf("%.2f", f)
		}
		cpu := fmt.Sprintf("%.1f/%.1f/%.1f", x.ProcCPU, x.PGCPU, x.BrokerCPU)
		fmt.Fprintf(tw, "%s\t%d\t%.0f\t%s\t%s\t%s\t%.0f\t%s\t%.2f\t%s\t%s\t\n", x.Name, x.Messages, x.Rate, lat50, lat99, at,
			x.PeakRSSMB, cpu, x.Load1, ratio(x.VsCeiling), ratio(x.VsNaive))
	}
	tw.Flush()
	r.printPipeline(w)
	r.printSoak(w)
	r.printScale(w)
	fmt.Fprintf(w, "\nceiling (best handler variant) %.0f msgs/s; 05-throughput's SQL ceiling %.0f msgs/s; naive %.0f msgs/s\n", r.Ceiling, r.Ceiling05, r.Naive)
	for _, g := range r.Goals {
		met := "MET"
		if !g.Met {
			met = "NOT MET"
		}
		fmt.Fprintf(w, "goal %-48s %10.3f  %-8s (%s)\n", g.Goal+":", g.Figure, met, g.Row)
	}
	fmt.Fprintln(w)
	b, _ := json.Marshal(r)
	fmt.Fprintln(w, string(b))
}

// printPipeline writes the pipeline phases' own figures: the ratio to the drain without
// events, the outbox's peak backlog and both latencies.
func (r *report) printPipeline(w io.Writer) {
	var rows []row
	for _, x := range r.Rows {
		if x.Kind == "pipeline" {
			rows = append(rows, x)
		}
	}
	if len(rows) == 0 {
		return
	}
	fmt.Fprintln(w, "\npipeline, as examples/orders runs (relay in-process; msgs/s to every order applied and, with events, published and the outbox empty):")
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', tabwriter.AlignRight)
	fmt.Fprintln(tw, "phase\tmsgs\tmsgs/s\tvs drain\tapplied s\ttotal s\toutbox peak\teffect p50/p99 ms\tpublished p50/p99 ms\tat msgs/s\tpeak RSS MB\tCPU s proc/pg all/broker\tmachine busy\t")
	for _, x := range rows {
		dash := func(ok bool, s string) string {
			if !ok {
				return "-"
			}
			return s
		}
		fmt.Fprintf(tw, "%s\t%d\t%.0f\t%s\t%s\t%.2f\t%s\t%s\t%s\t%s\t%.0f\t%.1f/%.1f/%.1f\t%.2f/%d\t\n", x.Name, x.Messages, x.Rate,
			dash(x.VsDrain > 0, fmt.Sprintf("%.2f", x.VsDrain)), dash(x.Events, fmt.Sprintf("%.2f", x.AppliedSec)), x.DrainSeconds,
			dash(x.Events, fmt.Sprint(x.PeakBacklog)), dash(x.LatencyN > 0, fmt.Sprintf("%.1f/%.1f", x.P50, x.P99)),
			dash(x.PubN > 0, fmt.Sprintf("%.1f/%.1f", x.PubP50, x.PubP99)), dash(x.Offered > 0, fmt.Sprintf("%.0f", x.Offered)), x.PeakRSSMB,
			x.ProcCPU, x.PGServerCPU, x.BrokerCPU, x.MachineBusy, r.NProc)
	}
	tw.Flush()
}

// printSoak writes the soak's samples and summary.
func (r *report) printSoak(w io.Writer) {
	s := r.Soak
	if s == nil {
		return
	}
	fmt.Fprintf(w, "\nsoak: %.0fs at %.0f msgs/s offered (%d orders), relay in-process, a sample every %.0fs:\n", s.Seconds, s.Rate, s.Offered, s.Every)
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', tabwriter.AlignRight)
	fmt.Fprintln(tw, "t s\tRSS MB\tGo sys MB\teffect p50/p99 ms\tn\tpublished p50/p99 ms\tn\toutbox rows\tunpublished\t")
	for _, x := range s.Samples {
		fmt.Fprintf(tw, "%.0f\t%.0f\t%.0f\t%.1f/%.1f\t%d\t%.1f/%.1f\t%d\t%d\t%d\t\n", x.T, x.RSSMB, x.GoSysMB, x.P50, x.P99, x.N,
			x.PubP50, x.PubP99, x.PubN, x.OutboxRows, x.Unpublished)
	}
	tw.Flush()
	m := s.Summary
	fmt.Fprintf(w, "soak: peak RSS %.0f MB; first/last third medians: RSS %.0f/%.0f MB, effect p99 %.1f/%.1f ms, published p99 %.1f/%.1f ms, outbox %.0f/%.0f rows (max %d); published p50/p99 over the soak %.1f/%.1f ms\n",
		s.PeakRSSMB, m.RSSMedFirst, m.RSSMedLast, m.P99MedFirst, m.P99MedLast, m.PubP99MedFirst, m.PubP99MedLast,
		m.BacklogMedFirst, m.BacklogMedLast, m.BacklogMax, s.PubP50, s.PubP99)
}

// printScale writes the scale-out runs.
func (r *report) printScale(w io.Writer) {
	if len(r.Scale) == 0 {
		return
	}
	fmt.Fprintln(w, "\nscale-out: examples/orders processes in one group (CPU in cores over the timed window):")
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', tabwriter.AlignRight)
	fmt.Fprintln(tw, "procs\tmode\tmsgs\tmsgs/s\tvs drain\tgroup stable\toutbox peak\torders cores\tPostgreSQL cores\tbroker cores\tmachine busy\tpeak RSS MB\tload1\t")
	for _, x := range r.Scale {
		mode, vs, peak := "drain", "-", "-"
		if x.Events {
			mode, vs, peak = "e2e", fmt.Sprintf("%.2f", x.VsDrain), fmt.Sprint(x.PeakBack)
		}
		join := func(xs []float64, format string) string {
			out := make([]string, len(xs))
			for i, c := range xs {
				out[i] = fmt.Sprintf(format, c)
			}
			return strings.Join(out, "+")
		}
		fmt.Fprintf(tw, "%d\t%s\t%d\t%.0f\t%s\t%v\t%s\t%s\t%.2f\t%.2f\t%.2f/%d\t%s\t%.2f\t\n", x.Procs, mode, x.Counted, x.Rate, vs, x.Stable, peak,
			join(x.OrdersCores, "%.2f"), x.PGCores, x.BrokerCores, x.MachineCores, x.NProc, join(x.PeakRSSMB, "%.0f"), x.Load1)
	}
	tw.Flush()
}
