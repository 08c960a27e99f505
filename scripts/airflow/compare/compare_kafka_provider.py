"""compare_kafka_provider: Airflow's own Kafka event-driven scheduling, for scripts/compare-kafka-trigger.

An AssetWatcher with the common-messaging MessageQueueTrigger (scheme "kafka": the Kafka
provider's AwaitMessageTrigger) on $COMPARE_PROVIDER_TOPIC; each message becomes an asset event
whose payload is the change event's id, and the asset schedules this DAG. The consumer is the
connection kafka_default (AIRFLOW_CONN_KAFKA_DEFAULT, set by the script).
"""

from __future__ import annotations

import json
import os

from airflow.providers.common.messaging.triggers.msg_queue import MessageQueueTrigger
from airflow.sdk import Asset, AssetWatcher, dag, task


def extract_id(message):
    """The trigger's apply_function: the Debezium event's after.id (a truthy payload fires)."""
    value = json.loads(message.value())
    return {"id": value["after"]["id"], "tag": value["after"].get("e2e")}


trigger = MessageQueueTrigger(
    scheme="kafka",
    topics=[os.environ.get("COMPARE_PROVIDER_TOPIC", "compare.provider")],
    apply_function="compare_kafka_provider.extract_id",
)
events = Asset("kafka_compare_events", watchers=[AssetWatcher(name="kafka_compare_watcher", trigger=trigger)])


@dag(dag_id="compare_kafka_provider", schedule=[events], catchup=False, max_active_runs=16, tags=["kafkatx", "compare"])
def compare_kafka_provider():
    @task
    def consume() -> None:
        pass

    consume()


compare_kafka_provider()
