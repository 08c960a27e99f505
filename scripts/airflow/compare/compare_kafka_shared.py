"""compare_kafka_shared: the Kafka provider's KafkaSharedStreamTrigger (2.1.0), for scripts/compare-kafka-trigger.

An AssetWatcher with the provider's KafkaSharedStreamTrigger on $COMPARE_SHARED_TOPIC: the
triggerer's shared-stream manager polls one consumer (connection kafka_shared, set by the
script with enable.auto.commit false, as the trigger requires) and commits a message's offset
only after the asset event derived from it is stored. The trigger fires one event per message
whose payload is the message's value as text (the whole change event); the asset schedules
this DAG.
"""

from __future__ import annotations

import os

from airflow.providers.apache.kafka.triggers.shared_stream import KafkaSharedStreamTrigger
from airflow.sdk import Asset, AssetWatcher, dag, task

trigger = KafkaSharedStreamTrigger(
    topics=[os.environ.get("COMPARE_SHARED_TOPIC", "compare.shared")],
    kafka_config_id="kafka_shared",
)
events = Asset("kafka_compare_shared_events", watchers=[AssetWatcher(name="kafka_compare_shared_watcher", trigger=trigger)])


@dag(dag_id="compare_kafka_shared", schedule=[events], catchup=False, max_active_runs=16, tags=["kafkatx", "compare"])
def compare_kafka_shared():
    @task
    def consume() -> None:
        pass

    consume()


compare_kafka_shared()
