package main

import (
	"context"
	"fmt"
	"slices"
	"strconv"
	"time"

	"github.com/confluentinc/confluent-kafka-go/v2/kafka"

	"github.com/kafkatx/kafkatx/examples/orders/order"
)

// soakSample is one window of the soak: what the service process reported at its end and
// the produce -> published latencies of the events the parent read back in it.
type soakSample struct {
	T           float64         `json:"t_s"`         // seconds since the offered load started
	RSSMB       float64         `json:"rss_mb"`      // the service process's VmRSS
	GoSysMB     float64         `json:"go_sys_mb"`   // memory the Go runtime holds from the OS
	Committed   int64           `json:"committed"`   // orders committed so far (warm-up included)
	N           int             `json:"latency_n"`   // stamped orders committed in the window
	P50         float64         `json:"p50_ms"`      // produce -> committed effect, the window's
	P99         float64         `json:"p99_ms"`      //
	PubN        int             `json:"pub_n"`       // events of stamped orders read back in the window
	PubP50      float64         `json:"pub_p50_ms"`  // produce -> published (broker append time)
	PubP99      float64         `json:"pub_p99_ms"`  //
	OutboxRows  int64           `json:"outbox_rows"` // pending outbox rows (SELECT count(*))
	Unpublished int64           `json:"unpublished"` // orders committed and not yet on the events topic
	Published   int64           `json:"published"`   // records on the events topic (watermarks)
	pub         []time.Duration `json:"-"`           // the window's raw published latencies
}

// soakReport is the soak's figures: its settings, the samples and their summary.
type soakReport struct {
	Seconds    float64      `json:"seconds"` // of offered load
	Rate       float64      `json:"offered_per_s"`
	Every      float64      `json:"sample_every_s"`
	Offered    int          `json:"offered"`
	PeakRSSMB  float64      `json:"peak_rss_mb"` // VmHWM of the service process at its end
	Samples    []soakSample `json:"samples"`
	Summary    soakSummary  `json:"summary"`
	PubP50     float64      `json:"pub_p50_ms"` // over the whole soak
	PubP99     float64      `json:"pub_p99_ms"`
	WorstP99   float64      `json:"worst_window_p99_ms"`
	WorstPub99 float64      `json:"worst_window_pub_p99_ms"`
}

// soakSummary compares the soak's first and last thirds, warm-up left out (medians of their
// samples): a flat soak has growth near 1 for RSS and latencies, and a backlog that does not
// climb.
type soakSummary struct {
	RSSGrowth       float64 `json:"rss_last_over_first"`
	RSSMedFirst     float64 `json:"rss_first_third_mb"`
	RSSMedLast      float64 `json:"rss_last_third_mb"`
	P99MedFirst     float64 `json:"p99_first_third_ms"`
	P99MedLast      float64 `json:"p99_last_third_ms"`
	PubP99MedFirst  float64 `json:"pub_p99_first_third_ms"`
	PubP99MedLast   float64 `json:"pub_p99_last_third_ms"`
	BacklogMedFirst float64 `json:"outbox_rows_first_third"`
	BacklogMedLast  float64 `json:"outbox_rows_last_third"`
	BacklogMax      int64   `json:"outbox_rows_max"`
}

// soakWarmup is the start of the soak the summary leaves out when enough follows: the heap
// grows to its working size (GOGC 400 up to the 128 MiB limit) in the first tens of seconds.
const soakWarmup = 60.0 // seconds

// summarize fills the soak summary from samples. The last sample, a partial window taken
// when the offered load was done, is left out unless it is the only one; so are the samples
// of the first soakWarmup seconds when at least three full samples come after them.
func summarize(samples []soakSample) soakSummary {
	var s soakSummary
	full := samples
	if len(full) > 1 {
		full = full[:len(full)-1]
	}
	if len(full) == 0 {
		return s
	}
	skip := 0
	for skip < len(full) && full[skip].T <= soakWarmup {
		skip++
	}
	if len(full)-skip >= 3 {
		full = full[skip:]
	}
	third := max(1, len(full)/3)
	first, last := full[:third], full[len(full)-third:]
	med := func(xs []soakSample, f func(soakSample) float64) float64 {
		v := make([]float64, len(xs))
		for i, x := range xs {
			v[i] = f(x)
		}
		slices.Sort(v)
		if len(v)%2 == 1 {
			return v[len(v)/2]
		}
		return (v[len(v)/2-1] + v[len(v)/2]) / 2
	}
	rss := func(x soakSample) float64 { return x.RSSMB }
	p99 := func(x soakSample) float64 { return x.P99 }
	pub := func(x soakSample) float64 { return x.PubP99 }
	backlog := func(x soakSample) float64 { return float64(x.OutboxRows) }
	s.RSSMedFirst, s.RSSMedLast = med(first, rss), med(last, rss)
	if s.RSSMedFirst > 0 {
		s.RSSGrowth = round3(s.RSSMedLast / s.RSSMedFirst)
	}
	s.P99MedFirst, s.P99MedLast = med(first, p99), med(last, p99)
	s.PubP99MedFirst, s.PubP99MedLast = med(first, pub), med(last, pub)
	s.BacklogMedFirst, s.BacklogMedLast = med(first, backlog), med(last, backlog)
	for _, x := range samples {
		s.BacklogMax = max(s.BacklogMax, x.OutboxRows)
	}
	return s
}

// soak runs the service with the relay at -soak-rate for -soak, sampling every
// -soak-every: a warm-up backlog first (so that the group has joined), then the offered load.
func (b *bench) soak(ctx context.Context) error {
	if b.o.soak <= 0 {
		return nil
	}
	const warm = 1000
	s := b.spec("pipeline", "soak")
	s.Batch, s.Messages, s.Events, s.Partitions, s.WithRelay = order.DefaultBatchSize, warm, true, b.o.partitions, true
	s.SampleEvery = b.o.soakEvery.Seconds()
	s.Timeout = b.o.soak.Seconds() + 900
	if err := b.pipelineTopics(ctx, s); err != nil {
		return err
	}
	pr, err := newProducer(b.o.brokers, s.Topic)
	if err != nil {
		return err
	}
	defer pr.close()
	if err := pr.backlog(ctx, warm); err != nil {
		return err
	}
	progress("soak: %s at %.0f msgs/s offered, relay in-process, a sample every %s", b.o.soak, b.o.soakRate, b.o.soakEvery)
	sr := &soakReport{Seconds: b.o.soak.Seconds(), Rate: b.o.soakRate, Every: s.SampleEvery}
	var all []time.Duration
	var win window
	rdc := make(chan *eventReader, 1) // onDrained's reader, handed over (it runs on its own goroutine)
	readerDone := make(chan error, 1)
	stopReader := make(chan struct{})
	r := row{Name: "soak", Kind: "soak", Batch: s.Batch, Events: true}
	onSample := func(e event) {
		pub := win.take()
		all = append(all, pub...)
		x := soakSample{T: e.Seconds, RSSMB: e.RSSMB, GoSysMB: e.GoHeapMB, Committed: e.Messages, N: e.Latency, P50: e.P50, P99: e.P99,
			PubN: len(pub), PubP50: quantile(pub, 0.5), PubP99: quantile(pub, 0.99), OutboxRows: e.OutboxRows,
			Published: e.Published, Unpublished: max(0, e.Messages-e.Published), pub: pub}
		sr.Samples = append(sr.Samples, x)
		progress("soak %4.0fs: RSS %.0f MB, effect p99 %.1f ms (%d), published p99 %.1f ms (%d), outbox %d rows",
			x.T, x.RSSMB, x.P99, x.N, x.PubP99, x.PubN, x.OutboxRows)
	}
	res, err := b.child(ctx, s, &r, func(e event) (string, error) {
		wm, err := newWatermarks(b.o.brokers, s.EventsTopic, b.o.partitions)
		if err != nil {
			return "", err
		}
		from, err := wm.highs()
		wm.close()
		if err != nil {
			return "", err
		}
		rd, err := newEventReader(b.o.brokers, s.EventsTopic, from)
		if err != nil {
			return "", err
		}
		rdc <- rd
		go func() {
			for {
				select {
				case <-stopReader:
					readerDone <- nil
					return
				default:
				}
				if m := rd.poll(100); m != nil {
					d, ok, err := publishedLatency(m, pr)
					if err != nil {
						readerDone <- err
						return
					}
					if ok {
						win.add(d)
					}
				}
			}
		}()
		r.Offered = b.o.soakRate
		sent, err := pr.paced(ctx, b.o.soakRate, b.o.soak)
		sr.Offered = sent
		if err != nil {
			return "", err
		}
		return strconv.Itoa(sent), nil
	}, onSample)
	var rd *eventReader
	select {
	case rd = <-rdc:
	default:
	}
	if rd != nil {
		close(stopReader)
		rerr := <-readerDone
		if rerr == nil && err == nil {
			// The events the reader had not reached when the last sample came belong to it.
			rerr = b.soakTail(ctx, rd, s.EventsTopic, pr, &win)
		}
		rd.close()
		if err == nil {
			err = rerr
		}
	}
	if err != nil {
		return err
	}
	if rest := win.take(); len(rest) > 0 && len(sr.Samples) > 0 {
		last := &sr.Samples[len(sr.Samples)-1]
		last.pub = append(last.pub, rest...)
		sortDurations(last.pub)
		last.PubN, last.PubP50, last.PubP99 = len(last.pub), quantile(last.pub, 0.5), quantile(last.pub, 0.99)
		all = append(all, rest...)
	}
	sortDurations(all)
	sr.PubP50, sr.PubP99 = quantile(all, 0.5), quantile(all, 0.99)
	for _, x := range sr.Samples {
		sr.WorstP99, sr.WorstPub99 = max(sr.WorstP99, x.P99), max(sr.WorstPub99, x.PubP99)
	}
	sr.Summary = summarize(sr.Samples)
	r.fromResult(res)
	sr.PeakRSSMB = r.PeakRSSMB
	r.Messages, r.PubN, r.PubP50, r.PubP99 = int64(sr.Offered), len(all), sr.PubP50, sr.PubP99
	r.P99 = sr.WorstP99
	r.Note = fmt.Sprintf("soak %s: p99 column = worst window's produce -> effect", b.o.soak)
	b.rep.Soak = sr
	b.rep.add(r)
	progress("soak: peak RSS %.0f MB; RSS first/last third %.0f/%.0f MB; worst window p99 %.1f ms effect, %.1f ms published; outbox max %d rows",
		sr.PeakRSSMB, sr.Summary.RSSMedFirst, sr.Summary.RSSMedLast, sr.WorstP99, sr.WorstPub99, sr.Summary.BacklogMax)
	return nil
}

// soakTail reads the events topic to its end with rd, adding the stamped orders' published
// latencies to win.
func (b *bench) soakTail(ctx context.Context, rd *eventReader, topic string, pr *producer, win *window) error {
	wm, err := newWatermarks(b.o.brokers, topic, len(rd.pos))
	if err != nil {
		return err
	}
	highs, err := wm.highs()
	wm.close()
	if err != nil {
		return err
	}
	return rd.readTo(ctx, highs, func(m *kafka.Message) error {
		d, ok, err := publishedLatency(m, pr)
		if ok {
			win.add(d)
		}
		return err
	})
}
