"""The comparison run by scripts/compare-kafka-trigger (run with the Airflow venv's python, which
has confluent_kafka once the Kafka provider is installed).

Both sides get the same N Debezium-shaped change events and K SIGKILLs at random moments:
  provider  Airflow's own Kafka event-driven scheduling (AssetWatcher + MessageQueueTrigger on
            the triggerer, DAG compare_kafka_provider); the triggerer is SIGKILLed and restarted.
  kafkatx   examples/dagtrigger starting one run of process_customer per event (the DAG is paused
            so its tasks do not run: a paused DAG still gets its queued runs); dagtrigger is
            SIGKILLed and restarted.
Then it reads back from Airflow's API: per event id, how many asset events / runs it got.
  lost        events with no asset event / no run
  duplicated  events with more than one asset event / run
  merged      events that share one run with another event (several asset events, one run)
"""

from __future__ import annotations

import argparse
import json
import os
import random
import signal
import subprocess
import sys
import time
import urllib.error
import urllib.parse
import urllib.request

from confluent_kafka import Producer
from confluent_kafka.admin import AdminClient, NewTopic


def env(name: str) -> str:
    v = os.environ.get(name)
    if not v:
        sys.exit(f"compare: {name} is not set")
    return v


class API:
    def __init__(self) -> None:
        self.url = env("AIRFLOW_URL")
        pw = open(env("AIRFLOW_PASSWORD_FILE")).read().strip()
        body = json.dumps({"username": env("AIRFLOW_USERNAME"), "password": pw}).encode()
        req = urllib.request.Request(self.url + "/auth/token", data=body, headers={"Content-Type": "application/json"})
        self.token = json.load(urllib.request.urlopen(req, timeout=20))["access_token"]

    def call(self, method: str, path: str, body=None):
        data = json.dumps(body).encode() if body is not None else None
        req = urllib.request.Request(self.url + path, data=data, method=method,
                                     headers={"Authorization": "Bearer " + self.token, "Content-Type": "application/json"})
        for attempt in range(5):  # a loaded 2-core machine makes the api-server slow at times
            try:
                return json.load(urllib.request.urlopen(req, timeout=60))
            except (TimeoutError, urllib.error.URLError) as err:
                if isinstance(err, urllib.error.HTTPError) or attempt == 4:
                    raise
                time.sleep(2)

    def pages(self, path: str, key: str):
        out, offset = [], 0
        sep = "&" if "?" in path else "?"
        while True:
            page = self.call("GET", f"{path}{sep}limit=100&offset={offset}")
            out += page[key]
            offset += 100
            if offset >= page["total_entries"]:
                return out


def event(i: int, tag: str, base: int) -> tuple[bytes, bytes]:
    key = json.dumps({"id": i}).encode()
    value = json.dumps({"before": None, "after": {"id": i, "status": "active", "e2e": tag},
                        "source": {"connector": "postgresql", "db": "app", "schema": "public", "table": "customers",
                                   "lsn": base + i * 64, "txId": base // 64 + i}, "op": "c", "ts_ms": 1790000000000}).encode()
    return key, value


def produce(brokers: str, topic: str, n: int, tag: str, base: int) -> None:
    p = Producer({"bootstrap.servers": brokers, "enable.idempotence": True})
    for i in range(1, n + 1):
        k, v = event(i, tag, base)
        p.produce(topic, key=k, value=v)
    if p.flush(30) != 0:
        sys.exit("compare: events not delivered")


def create_topics(brokers: str, topics: list[str]) -> None:
    admin = AdminClient({"bootstrap.servers": brokers})
    for f in admin.create_topics([NewTopic(t, 3, 1) for t in topics]).values():
        f.result(30)


def counts(ids_per_event: dict[int, int], n: int) -> dict:
    return {"lost": sum(1 for i in range(1, n + 1) if ids_per_event.get(i, 0) == 0),
            "duplicated": sum(1 for i in range(1, n + 1) if ids_per_event.get(i, 0) > 1)}


def restart_triggerer(state: str, envsh: str, airflow_bin: str, log: str) -> None:
    pid = int(open(os.path.join(state, "airflow.pid.triggerer")).read())
    try:
        os.killpg(pid, signal.SIGKILL)  # the triggerer and its trigger-runner subprocess
    except ProcessLookupError:
        pass
    time.sleep(1)
    with open(log, "a") as out:
        p = subprocess.Popen(["bash", "-c", f'. "{envsh}"; exec "{airflow_bin}" triggerer --skip-serve-logs'],
                             stdin=subprocess.DEVNULL, stdout=out, stderr=out, start_new_session=True)
    with open(os.path.join(state, "airflow.pid.triggerer.tmp"), "w") as f:
        f.write(f"{p.pid}\n")
    os.replace(os.path.join(state, "airflow.pid.triggerer.tmp"), os.path.join(state, "airflow.pid.triggerer"))


def provider_side(api: API, a, tag: str, base: int) -> dict:
    topic = a.provider_topic
    produce(a.brokers, topic, a.events, tag, base)
    start = time.time()
    # Kills spread over the time the trigger needs (about one event per 2 s).
    span = max(a.events * 2.0, 30.0)
    kill_at = sorted(random.uniform(5, span) for _ in range(a.kills))
    assets = [x for x in api.pages("/api/v2/assets?name_pattern=kafka_compare_events", "assets") if x["name"] == "kafka_compare_events"]
    if not assets:
        sys.exit("compare: the asset kafka_compare_events is unknown to Airflow (DAG not parsed?)")
    asset_id = assets[0]["id"]

    def ours():
        evs = api.pages(f"/api/v2/assets/events?asset_id={asset_id}", "asset_events")
        return [e for e in evs if ((e.get("extra") or {}).get("payload") or {}).get("tag") == tag]

    last_change, seen = time.time(), 0
    while True:
        if kill_at and time.time() - start >= kill_at[0]:
            kill_at.pop(0)
            restart_triggerer(a.state, a.envsh, a.airflow_bin, a.triggerer_log)
            print(f"provider: triggerer SIGKILLed and restarted at {time.time() - start:.0f} s", flush=True)
        evs = ours()
        if len(evs) != seen:
            seen, last_change = len(evs), time.time()
        if not kill_at and (time.time() - last_change > 60 or seen >= a.events and time.time() - last_change > 20):
            break
        time.sleep(3)
    elapsed = time.time() - start
    per_event: dict[int, int] = {}
    for e in evs:
        i = e["extra"]["payload"]["id"]
        per_event[i] = per_event.get(i, 0) + 1
    # Wait for the runs the asset events created, then who shares a run.
    time.sleep(15)
    runs = [r for r in api.pages("/api/v2/dags/compare_kafka_provider/dagRuns", "dag_runs")]
    events_in_run: dict[str, set] = {}
    for r in runs:
        ups = api.call("GET", "/api/v2/dags/compare_kafka_provider/dagRuns/" + urllib.parse.quote(r["dag_run_id"], safe="") + "/upstreamAssetEvents")
        ids = {((u.get("extra") or {}).get("payload") or {}).get("id") for u in ups["asset_events"]
               if ((u.get("extra") or {}).get("payload") or {}).get("tag") == tag}
        if ids:
            events_in_run[r["dag_run_id"]] = ids
    merged = sum(len(ids) - 1 for ids in events_in_run.values() if len(ids) > 1)
    c = counts(per_event, a.events)
    return {"side": "provider", "events": a.events, "kills": a.kills, "asset_events": len(evs), "runs": len(events_in_run),
            "lost": c["lost"], "duplicated": c["duplicated"], "merged": merged, "seconds": round(elapsed)}


def kafkatx_side(api: API, a, tag: str, base: int) -> dict:
    api.call("PATCH", "/api/v2/dags/process_customer", {"is_paused": True})
    produce(a.brokers, a.kafkatx_topic, a.events, tag, base)
    args = [a.dagtrigger, "--brokers", a.brokers, "--database-url", a.database_url, "--topic", a.kafkatx_topic,
            "--group", "compare-kafkatx-" + tag, "--airflow-url", api.url, "--dag-id", "process_customer",
            "--airflow-username", env("AIRFLOW_USERNAME"), "--airflow-password-file", env("AIRFLOW_PASSWORD_FILE"),
            "--instance-id", "compare-1", "--session-timeout", "10s", "--batch-size", "1"]
    log = open(a.dagtrigger_log, "a")
    start = time.time()
    for _ in range(a.kills):
        p = subprocess.Popen(args, stdout=subprocess.DEVNULL, stderr=log)
        time.sleep(random.uniform(2.5, 5.0))
        p.send_signal(signal.SIGKILL)
        p.wait()
    out = subprocess.run(args + ["--exit-when-idle", "5s"], stdout=subprocess.PIPE, stderr=log, timeout=600)
    elapsed = time.time() - start
    runs = [r for r in api.pages("/api/v2/dags/process_customer/dagRuns", "dag_runs") if (r.get("conf") or {}).get("e2e") == tag]
    per_event: dict[int, int] = {}
    for r in runs:
        i = r["conf"]["id"]
        per_event[i] = per_event.get(i, 0) + 1
    c = counts(per_event, a.events)
    summary = json.loads(out.stdout.decode().strip().splitlines()[-1]) if out.stdout.strip() else {}
    return {"side": "kafkatx", "events": a.events, "kills": a.kills, "asset_events": None, "runs": len(runs),
            "lost": c["lost"], "duplicated": c["duplicated"], "merged": 0, "seconds": round(elapsed),
            "dead_lettered": summary.get("dead_lettered")}


def main() -> None:
    ap = argparse.ArgumentParser()
    for name in ("brokers", "database-url", "dagtrigger", "state", "envsh", "airflow-bin", "provider-topic",
                 "kafkatx-topic", "triggerer-log", "dagtrigger-log", "tag"):
        ap.add_argument("--" + name, required=True)
    ap.add_argument("--events", type=int, default=60)
    ap.add_argument("--kills", type=int, default=5)
    a = ap.parse_args()
    api = API()
    create_topics(a.brokers, [a.kafkatx_topic])
    base = random.randrange(1, 1 << 30) * 64
    results = [provider_side(api, a, a.tag, base), kafkatx_side(api, a, a.tag, base + (1 << 40))]
    print()
    print(f"{'side':<9} {'events':>6} {'kills':>5} {'asset events':>12} {'runs':>5} {'lost':>5} {'duplicated':>10} {'merged':>6} {'seconds':>7}")
    for r in results:
        ae = "-" if r["asset_events"] is None else r["asset_events"]
        print(f"{r['side']:<9} {r['events']:>6} {r['kills']:>5} {ae:>12} {r['runs']:>5} {r['lost']:>5} {r['duplicated']:>10} {r['merged']:>6} {r['seconds']:>7}")
    print(json.dumps(results))


if __name__ == "__main__":
    main()
