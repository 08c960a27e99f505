package promreg

import (
	"testing"

	"github.com/prometheus/client_golang/prometheus"
)

func TestRegisterReusesAnEqualCollectorAndRefusesAConflict(t *testing.T) {
	reg := prometheus.NewRegistry()
	opts := prometheus.CounterOpts{Name: "x_total", Help: "x"}
	first, err := Register(reg, prometheus.NewCounterVec(opts, []string{"group"}))
	if err != nil {
		t.Fatal(err)
	}
	second, err := Register(reg, prometheus.NewCounterVec(opts, []string{"group"}))
	if err != nil {
		t.Fatalf("an equal collector registered twice: %v; want the first one back", err)
	}
	if first != second {
		t.Fatal("the second registration did not return the collector registered first")
	}
	second.WithLabelValues("a").Inc()
	if _, err := Register(reg, prometheus.NewCounterVec(opts, []string{"other"})); err == nil {
		t.Fatal("a collector with the same name and other labels was accepted")
	}
	if c, err := Register[prometheus.Counter](nil, prometheus.NewCounter(opts)); err != nil || c == nil {
		t.Fatalf("nil registry: %v, %v", c, err)
	}
}
