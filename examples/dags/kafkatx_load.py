"""kafkatx_load: a DAG that is only triggered, never run: the target of dagtrigger's load tests.

It is paused when Airflow first parses it, so the runs that examples/dagtrigger's tests against
a real Airflow start (`go -C examples test -run RealAirflowLoad ./dagtrigger/`) stay queued: what
is measured is the REST API's create (POST /api/v2/dags/kafkatx_load/dagRuns), not the
scheduler running tasks on the same two cores.
"""

from __future__ import annotations

from airflow.providers.standard.operators.empty import EmptyOperator
from airflow.sdk import dag


@dag(dag_id="kafkatx_load", schedule=None, catchup=False, is_paused_upon_creation=True, tags=["kafkatx", "test"])
def kafkatx_load():
    EmptyOperator(task_id="noop")


kafkatx_load()
