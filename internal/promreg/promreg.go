// Package promreg registers kafkatx's Prometheus collectors and reports what the registry
// refuses instead of dropping it.
package promreg

import (
	"errors"
	"fmt"

	"github.com/prometheus/client_golang/prometheus"
)

// Register registers c with reg and returns the collector to use: c itself, or — when reg
// already holds an equal collector, as when two consumers of one process share a registry —
// the one registered first, so both count into it (their label values tell them apart). Any
// other refusal (a name registered with other labels or help) is returned as an error. A nil
// reg registers nothing and returns c.
func Register[T prometheus.Collector](reg prometheus.Registerer, c T) (T, error) {
	if reg == nil {
		return c, nil
	}
	err := reg.Register(c)
	if err == nil {
		return c, nil
	}
	var are prometheus.AlreadyRegisteredError
	if errors.As(err, &are) {
		if existing, ok := are.ExistingCollector.(T); ok {
			return existing, nil
		}
	}
	var zero T
	return zero, fmt.Errorf("register Prometheus collector: %w", err)
}

// Into registers *c with reg and replaces it with the collector to use (see Register). Once
// *err is set it does nothing, so a run of calls reports the first refusal:
//
//	var err error
//	promreg.Into(reg, &m.processed, &err)
//	promreg.Into(reg, &m.lag, &err)
//	if err != nil { … }
func Into[T prometheus.Collector](reg prometheus.Registerer, c *T, err *error) {
	if *err != nil {
		return
	}
	*c, *err = Register(reg, *c)
}
