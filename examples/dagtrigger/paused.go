package main

import (
	"flag"
	"fmt"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/kafkatx/kafkatx/cmd/flagcheck"
	"github.com/kafkatx/kafkatx/idempotency/airflow"
)

// pausedFlags are --when-paused and --airflow-dag-state-interval: what dagtrigger does with
// runs of a DAG Airflow reports paused (airflow.DAGStateConfig; docs/dag-triggered-services.md,
// "A paused DAG").
type pausedFlags struct {
	policy   string
	interval time.Duration
}

func (p *pausedFlags) register(fs *flag.FlagSet) {
	fs.StringVar(&p.policy, "when-paused", string(airflow.PausedPost), "what a run of a DAG Airflow reports paused does: post (the default: the run is created and stays queued until the DAG is unpaused; nothing is lost and the partition goes on) or hold (nothing is posted: the partition waits, spending no attempt, until the DAG is unpaused, for at most --airflow-wait-max); either way the pause is logged once per change, kafkatx_airflow_dag_paused is 1 and /readyz notes it")
	fs.DurationVar(&p.interval, "airflow-dag-state-interval", airflow.DefaultDAGStateInterval, "how long the DAG's is_paused, read with GET /api/v2/dags/{dag_id}, is reused before it is read again (1s to 1h): one read per interval, not per event")
}

func (p pausedFlags) check() error {
	if p.policy != string(airflow.PausedPost) && p.policy != string(airflow.PausedHold) {
		return fmt.Errorf("--when-paused %s: want post or hold", flagcheck.Quote(p.policy))
	}
	return flagcheck.Duration("airflow-dag-state-interval", p.interval, time.Second, time.Hour)
}

func (p pausedFlags) config(reg prometheus.Registerer) airflow.DAGStateConfig {
	return airflow.DAGStateConfig{Interval: p.interval, WhenPaused: airflow.PausedPolicy(p.policy), Registerer: reg}
}
