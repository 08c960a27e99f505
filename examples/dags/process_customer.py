"""process_customer: one run per customer change event, started by kafkatx's examples/dagtrigger.

dagtrigger consumes Debezium change events of the customers table and starts one run of this DAG
per event through Airflow's REST API v2, with dag_run_id derived from the event's source position
and conf = the event's `after` row (for a delete: {"op": "d", "before": {...}}).

Each task calls examples/dagservice with the header

    Idempotency-Key: {dag_id}/{run_id}/{task_id}/{map_index}

so a task instance that Airflow retries (a worker died, a timeout, a retry after failure) gets
the answer of its first successful call back instead of doing the work twice: dagservice writes
the task's result and the stored response in one database transaction and replays it, marked
with `Idempotent-Replayed: true`. try_number is deliberately not part of the key.

The request body must be the same on every try (the service answers 422 to the same key with
another body), so it is built only from the run's conf and the task's arguments, serialized
with sorted keys: no timestamps, no random ids.

Airflow 3 (Task SDK). Set DAGSERVICE_URL to dagservice's base URL (default
http://127.0.0.1:8090).
"""

from __future__ import annotations

import json
import os
import time
import urllib.error
import urllib.request
from datetime import timedelta

from airflow.sdk import dag, get_current_context, task

DAGSERVICE_URL = os.environ.get("DAGSERVICE_URL", "http://127.0.0.1:8090")


def call_service(name: str, payload: dict) -> dict:
    """POST payload to dagservice's /tasks/{name} with this task instance's idempotency key."""
    ti = get_current_context()["ti"]
    key = f"{ti.dag_id}/{ti.run_id}/{ti.task_id}/{ti.map_index}"
    body = json.dumps(payload, sort_keys=True, separators=(",", ":")).encode()
    request = urllib.request.Request(
        f"{DAGSERVICE_URL}/tasks/{name}",
        data=body,
        method="POST",
        headers={"Content-Type": "application/json", "Idempotency-Key": key},
    )
    for _ in range(30):
        try:
            with urllib.request.urlopen(request, timeout=30) as response:
                replayed = response.headers.get("Idempotent-Replayed") == "true"
                result = json.load(response)
                print(f"{name}: {'replayed' if replayed else 'computed'} result for {key}")
                return result
        except urllib.error.HTTPError as err:
            if err.code == 409:
                # An earlier try of this task instance is still being served: ask again later.
                time.sleep(float(err.headers.get("Retry-After") or 1))
                continue
            raise  # 400/422 are bugs in this DAG; 5xx were rolled back: Airflow's retry runs again
    raise RuntimeError(f"{name}: {key} still in progress after 30 tries")


@dag(
    dag_id="process_customer",
    schedule=None,  # started only through the REST API, one run per change event
    catchup=False,
    max_active_runs=16,
    default_args={"retries": 3, "retry_delay": timedelta(seconds=10)},
    tags=["kafkatx", "cdc"],
)
def process_customer():
    @task
    def score() -> dict:
        conf = get_current_context()["dag_run"].conf or {}
        return call_service("score", {"customer": conf.get("id"), "status": conf.get("status")})

    @task
    def enrich(source: str, scored: dict) -> dict:
        # A mapped task: each source is its own task instance, told apart by map_index.
        return call_service("enrich", {"source": source, "customer": scored["input"]["customer"]})

    @task
    def notify(results: list[dict]) -> None:
        call_service("notify", {"results": sorted(r["idempotency_key"] for r in results)})

    scored = score()
    notify(enrich.partial(scored=scored).expand(source=["crm", "billing"]))


process_customer()
