"""process_customer_asset: a DAG scheduled on the asset `kafkatx_customers`, fed by kafkatx.

examples/dagtrigger started with `--asset kafkatx_customers` (instead of `--dag-id`) creates one
asset event per customer change event through Airflow's REST API v2
(POST /api/v2/assets/events), its `extra` carrying the event's `kafkatx_id` (unique per Kafka
event, stable across retries and crashes) and the change's `after` row.

What Airflow then does with the events is Airflow's asset scheduling, not kafkatx's: the
scheduler queues one row per (asset, DAG) and starts a run when it next looks, and a run
consumes every event queued since the DAG's last run. Several events may therefore start ONE run
(they arrive in the run's `triggering_asset_events`), and none is lost or run twice by that. This
DAG's task only reads those events and prints each kafkatx_id; it calls nothing outside Airflow.
"""

from __future__ import annotations

from airflow.sdk import Asset, dag, get_current_context, task

KAFKATX_CUSTOMERS = Asset(name="kafkatx_customers", uri="kafkatx://customers")


@dag(dag_id="process_customer_asset", schedule=[KAFKATX_CUSTOMERS], catchup=False, tags=["kafkatx", "asset"])
def process_customer_asset():
    @task
    def report_events() -> int:
        """Print the kafkatx_id of every asset event that started this run; return their count."""
        events = get_current_context()["triggering_asset_events"]
        n = 0
        for asset, asset_events in events.items():
            for event in asset_events:
                extra = event.extra or {}
                print(f"{asset}: kafkatx_id={extra.get('kafkatx_id')}")
                n += 1
        return n

    report_events()


process_customer_asset()
