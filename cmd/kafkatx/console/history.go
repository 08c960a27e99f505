package console

import (
	"context"
	"fmt"
	"html/template"
	"net/http"
	"strconv"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/kafkatx/kafkatx/internal/tables"
	"go.uber.org/zap"
)

// Defaults of the sampled history behind the lag and throughput charts.
const (
	// SampleEveryDefault is how often the console samples every partition's watermark and log
	// end (Config.SampleEvery).
	SampleEveryDefault = time.Minute
	// SampleRetentionDefault is how long samples are kept (Config.SampleRetention).
	SampleRetentionDefault = 7 * 24 * time.Hour
	// chartWindow is the history one chart shows.
	chartWindow = time.Hour
	// maxSamplesRead bounds the samples one page reads (about 1,000 partitions at one a minute).
	maxSamplesRead = 60_000
)

// Sample is one partition's position at one time: GET /api/partitions/history's rows.
type Sample struct {
	At        time.Time `json:"at"`
	Watermark int64     `json:"watermark"`
	LogEnd    int64     `json:"log_end"`
	// Lag is LogEnd minus Watermark, in records.
	Lag int64 `json:"lag"`
	// Rate is the watermark's advance since the previous sample per second (records/s); 0
	// for the first sample, and for the first one in another log (TopicID changed: the topic
	// deleted, created again and adopted), whose watermark counts offsets of its own.
	Rate float64 `json:"rate"`
	// TopicID is the topic id of the log the watermark was in (migration 011); "" when
	// unknown (a sample from before it).
	TopicID string `json:"topic_id,omitempty"`
}

func (h *Handler) samplesTable() string {
	return tables.For(h.cfg.Schema).PartitionSamples
}

// sampleLoop samples every partition each SampleEvery and deletes samples older than
// SampleRetention, until stop is closed.
func (h *Handler) sampleLoop(stop <-chan struct{}, done chan<- struct{}) {
	defer close(done)
	t := time.NewTicker(h.cfg.SampleEvery)
	defer t.Stop()
	for {
		ctx, cancel := context.WithTimeout(context.Background(), RequestTimeout)
		if err := h.sampleOnce(ctx); err != nil {
			h.log.Warn("console: sample partitions for the charts", zap.String("error", h.redact(err.Error())))
		}
		cancel()
		select {
		case <-stop:
			return
		case <-t.C:
		}
	}
}

// sampleOnce writes one sample per partition of every group with a watermark.
func (h *Handler) sampleOnce(ctx context.Context) error {
	rows, err := h.partitions(ctx, "")
	if err != nil {
		return err
	}
	b := &pgx.Batch{}
	for _, r := range rows {
		if r.Error != "" || r.Watermark < 0 {
			continue
		}
		b.Queue(`INSERT INTO `+h.samplesTable()+` (group_id, topic, partition, at, watermark, log_end, lag, topic_id)
			VALUES ($1, $2, $3, clock_timestamp(), $4, $5, $6, $7) ON CONFLICT DO NOTHING`, r.Group, r.Topic, r.Partition, r.Watermark, r.LogEnd, r.Lag, r.TopicID)
	}
	b.Queue(`DELETE FROM `+h.samplesTable()+` WHERE at < now() - make_interval(secs => $1)`, h.cfg.SampleRetention.Seconds())
	return h.cfg.Pool.SendBatch(ctx, b).Close()
}

// history reads the samples of the last window, by partition (group "" : every group).
func (h *Handler) history(ctx context.Context, group string, window time.Duration) (map[tpKey][]Sample, error) {
	rows, err := h.cfg.Pool.Query(ctx, `SELECT group_id, topic, partition, at, watermark, log_end, lag, topic_id FROM `+h.samplesTable()+`
		WHERE at > now() - make_interval(secs => $1) AND ($2 = '' OR group_id = $2) ORDER BY group_id, topic, partition, at LIMIT $3`,
		window.Seconds(), group, maxSamplesRead)
	if err != nil {
		return nil, fmt.Errorf("partition history: %w", err)
	}
	defer rows.Close()
	out := map[tpKey][]Sample{}
	for rows.Next() {
		var k tpKey
		var s Sample
		if err := rows.Scan(&k.group, &k.topic, &k.partition, &s.At, &s.Watermark, &s.LogEnd, &s.Lag, &s.TopicID); err != nil {
			return nil, fmt.Errorf("partition history: %w", err)
		}
		if prev := out[k]; len(prev) > 0 {
			p := prev[len(prev)-1]
			if dt := s.At.Sub(p.At).Seconds(); dt > 0 && s.Watermark >= p.Watermark && sameLog(p.TopicID, s.TopicID) {
				s.Rate = float64(s.Watermark-p.Watermark) / dt
			}
		}
		out[k] = append(out[k], s)
	}
	return out, rows.Err()
}

// sameLog reports whether two samples' topic ids name the same log; an unknown id ("", a
// sample from before migration 011) is taken for the same.
func sameLog(a, b string) bool { return a == "" || b == "" || a == b }

// apiHistory answers GET /api/partitions/history?group=G&topic=T&partition=P[&window=1h]:
// the partition's samples, oldest first.
func (h *Handler) apiHistory(w http.ResponseWriter, r *http.Request) {
	q := r.URL.Query()
	g, topic := q.Get("group"), q.Get("topic")
	p, err := strconv.ParseInt(q.Get("partition"), 10, 32)
	if g == "" || topic == "" || err != nil || p < 0 {
		h.fail(w, r, http.StatusBadRequest, "group, topic and partition are required: /api/partitions/history?group=G&topic=T&partition=P[&window=1h]")
		return
	}
	window := chartWindow
	if s := q.Get("window"); s != "" {
		if window, err = time.ParseDuration(s); err != nil || window <= 0 || window > h.cfg.SampleRetention {
			h.fail(w, r, http.StatusBadRequest, fmt.Sprintf("window %q: want a duration from 1s to the retention, %v", s, h.cfg.SampleRetention))
			return
		}
	}
	hist, err := h.history(r.Context(), g, window)
	if err != nil {
		h.fail(w, r, http.StatusInternalServerError, err.Error())
		return
	}
	out := hist[tpKey{g, topic, int32(p)}]
	if out == nil {
		out = []Sample{}
	}
	h.writeJSON(w, http.StatusOK, out)
}

// chartSVG draws samples as an inline SVG of width × height pixels: the lag (solid line, left
// scale, 0 at the baseline) and the throughput (dashed, records/s, right scale, 0 at the
// baseline) over time, a dot at the latest lag, and along the top the latest lag and rate as
// text ("lag 3", "1.5 rec/s"; with labels, the scales' tops and the time span too). A chart at
// lag 0 thus shows its baseline, a line on it and "lag 0", not an empty box; one sample is a
// dot. Only numbers go into it, so it is safe as template.HTML; it needs no script and no
// style beyond the sheet.
func chartSVG(samples []Sample, width, height int, labels bool) template.HTML {
	if len(samples) == 0 {
		return template.HTML(fmt.Sprintf(`<svg class="chart" width="%d" height="%d" role="img" aria-label="no samples yet"><text x="4" y="%d">no samples yet</text></svg>`, width, height, height/2+3))
	}
	var maxLag int64 = 1
	maxRate := 1.0
	for _, s := range samples {
		maxLag, maxRate = max(maxLag, s.Lag), max(maxRate, s.Rate)
	}
	t0, t1 := samples[0].At, samples[len(samples)-1].At
	span := t1.Sub(t0).Seconds()
	// The plot sits below a 10 px line of text; with labels, the times take a line below it.
	left, top, bottom := 4.0, 14.0, 3.0
	if labels {
		left, bottom = 14, 14
	}
	w, hgt := float64(width)-2*left, float64(height)-top-bottom
	x := func(s Sample) float64 {
		if span <= 0 {
			return left + w
		}
		return left + w*s.At.Sub(t0).Seconds()/span
	}
	yLag := func(s Sample) float64 { return top + hgt - hgt*float64(s.Lag)/float64(maxLag) }
	var lag, rate strings.Builder
	for i, s := range samples {
		sep := " "
		if i == 0 {
			sep = ""
		}
		fmt.Fprintf(&lag, "%s%.1f,%.1f", sep, x(s), yLag(s))
		fmt.Fprintf(&rate, "%s%.1f,%.1f", sep, x(s), top+hgt-hgt*s.Rate/maxRate)
	}
	last := samples[len(samples)-1]
	var b strings.Builder
	fmt.Fprintf(&b, `<svg class="chart" width="%d" height="%d" viewBox="0 0 %d %d" role="img" aria-label="lag %d now, at most %d; %.1f records/s now">`,
		width, height, width, height, last.Lag, maxLag, last.Rate)
	fmt.Fprintf(&b, `<line class="axis" x1="%.1f" y1="%.1f" x2="%.1f" y2="%.1f"/>`, left, top+hgt, left+w, top+hgt)
	fmt.Fprintf(&b, `<polyline class="rate" points="%s"/><polyline class="lag" points="%s"/>`, rate.String(), lag.String())
	fmt.Fprintf(&b, `<circle class="now" cx="%.1f" cy="%.1f" r="2.5"/>`, x(last), yLag(last))
	if labels {
		fmt.Fprintf(&b, `<text class="value" x="%.0f" y="10">lag %d now (scale %d)</text><text class="value" x="%.0f" y="10" text-anchor="end">%.1f rec/s now (scale %.1f)</text>`,
			left, last.Lag, maxLag, left+w, last.Rate, maxRate)
		fmt.Fprintf(&b, `<text x="%.0f" y="%d">%s</text><text x="%.0f" y="%d" text-anchor="end">%s</text>`,
			left, height-2, t0.UTC().Format("15:04:05"), left+w, height-2, t1.UTC().Format("15:04:05Z"))
	} else {
		fmt.Fprintf(&b, `<text class="value" x="%.0f" y="10">lag %d</text><text class="value" x="%.0f" y="10" text-anchor="end">%.1f rec/s</text>`,
			left, last.Lag, left+w, last.Rate)
	}
	b.WriteString(`</svg>`)
	return template.HTML(b.String()) //nolint:gosec // numbers and fixed text only
}
