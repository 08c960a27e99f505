"""The comparison run by scripts/compare-kafka-trigger (run with the Airflow venv's python, which
has confluent_kafka once the Kafka provider is installed).

Three sides get the same Debezium-shaped change events, on a broker of the script's own (the
broker is restarted once in each run):
  await     the Kafka provider's AwaitMessageTrigger (AssetWatcher + common-messaging
            MessageQueueTrigger on the triggerer; DAG compare_kafka_provider)
  shared    the Kafka provider's KafkaSharedStreamTrigger (2.1.0; AssetWatcher on the triggerer's
            shared-stream manager; DAG compare_kafka_shared)
  kafkatx   examples/dagtrigger starting one run of process_customer per event
Phase "kills": EVENTS events; the two provider sides run at once under the same KILLS SIGKILLs of
the triggerer (with its trigger-runner subprocess) and one broker restart; dagtrigger gets KILLS
SIGKILLs and one broker restart of its own. Phase "paused": PAUSED more events arrive while each
side's DAG is paused; the providers' DAGs are unpaused after a wait, dagtrigger's stays paused
(its runs stay queued; process_customer's tasks need examples/dagservice, which is not run).
Then it reads back from Airflow's API, per event id:
  lost        events with no asset event (provider) / no run (kafkatx)
  duplicated  events with more than one asset event / run
  merged      events that share one run with another event (several asset events, one run)
and, for what an operator can see, each consumer group's committed offsets against the log end.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import signal
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.parse
import urllib.request

from confluent_kafka import Consumer, Producer, TopicPartition
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
        self.retried = 0  # calls repeated after a timeout or a 500

    def call(self, method: str, path: str, body=None):
        data = json.dumps(body).encode() if body is not None else None
        req = urllib.request.Request(self.url + path, data=data, method=method,
                                     headers={"Authorization": "Bearer " + self.token, "Content-Type": "application/json"})
        for attempt in range(30):
            try:
                return json.load(urllib.request.urlopen(req, timeout=60))
            except (TimeoutError, urllib.error.URLError) as err:
                # A loaded 2-core machine makes the api-server slow at times; and Airflow 3.3.2's
                # GET /api/v2/assets/events answers 500 while a run created from one of the
                # events has not started (its start_date is None: a validation error).
                if isinstance(err, urllib.error.HTTPError) and err.code != 500 or attempt == 29:
                    raise
                self.retried += 1
                time.sleep(3)

    def pages(self, path: str, key: str):
        out, offset = [], 0
        sep = "&" if "?" in path else "?"
        while True:
            page = self.call("GET", f"{path}{sep}limit=100&offset={offset}")
            out += page[key]
            offset += 100
            if offset >= page["total_entries"]:
                return out

    def pause(self, dag_id: str, paused: bool) -> None:
        self.call("PATCH", f"/api/v2/dags/{dag_id}", {"is_paused": paused})


def event(i: int, tag: str, base: int) -> tuple[bytes, bytes]:
    key = json.dumps({"id": i}).encode()
    value = json.dumps({"before": None, "after": {"id": i, "status": "active", "e2e": tag},
                        "source": {"connector": "postgresql", "db": "app", "schema": "public", "table": "customers",
                                   "lsn": base + i * 64, "txId": base // 64 + i}, "op": "c", "ts_ms": 1790000000000}).encode()
    return key, value


def produce(brokers: str, topics: list[str], ids: range, tag: str, base: int, where: dict) -> None:
    """Produce events ids to each topic; where[topic][id] = (partition, offset) of each."""
    p = Producer({"bootstrap.servers": brokers, "enable.idempotence": True})

    def delivered(err, msg, i):
        if err is None:
            where.setdefault(msg.topic(), {})[i] = (msg.partition(), msg.offset())

    for i in ids:
        k, v = event(i, tag, base)
        for t in topics:
            p.produce(t, key=k, value=v, on_delivery=lambda err, msg, i=i: delivered(err, msg, i))
    if p.flush(60) != 0 or any(len(where.get(t, {})) < sum(1 for _ in ids) for t in topics):
        sys.exit("compare: events not delivered")


def create_topics(brokers: str, topics: list[str]) -> None:
    admin = AdminClient({"bootstrap.servers": brokers})
    for f in admin.create_topics([NewTopic(t, 3, 1) for t in topics]).values():
        f.result(30)


def committed(brokers: str, group: str, topic: str) -> dict[int, int]:
    """The group's committed offset per partition of the topic (0 when none): what
    `kafka-consumer-groups --describe` shows an operator."""
    c = Consumer({"bootstrap.servers": brokers, "group.id": group, "enable.auto.commit": False})
    try:
        return {tp.partition: max(tp.offset, 0) for tp in c.committed([TopicPartition(topic, p) for p in range(3)], timeout=30)}
    finally:
        c.close()


def restart_triggerer(a) -> None:
    pid = int(open(os.path.join(a.state, "airflow.pid.triggerer")).read())
    try:
        os.killpg(pid, signal.SIGKILL)  # the triggerer and its trigger-runner subprocess
    except ProcessLookupError:
        pass
    time.sleep(1)
    with open(a.triggerer_log, "a") as out:
        p = subprocess.Popen(["bash", "-c", f'. "{a.envsh}"; exec "{a.airflow_bin}" triggerer --skip-serve-logs'],
                             stdin=subprocess.DEVNULL, stdout=out, stderr=out, start_new_session=True)
    with open(os.path.join(a.state, "airflow.pid.triggerer.tmp"), "w") as f:
        f.write(f"{p.pid}\n")
    os.replace(os.path.join(a.state, "airflow.pid.triggerer.tmp"), os.path.join(a.state, "airflow.pid.triggerer"))


def restart_broker(a, who: str) -> None:
    """SIGKILL the script's own broker and bring it back (never the shared one)."""
    t = time.time()
    subprocess.run(["bash", "-c", a.broker_restart], check=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, timeout=300)
    print(f"{who}: broker SIGKILLed and back after {time.time() - t:.0f} s", flush=True)


class ProviderSide:
    def __init__(self, api: API, name: str, asset: str, dag_id: str, tag: str) -> None:
        self.api, self.name, self.dag_id, self.tag = api, name, dag_id, tag
        assets = [x for x in api.pages(f"/api/v2/assets?name_pattern={asset}", "assets") if x["name"] == asset]
        if not assets:
            sys.exit(f"compare: the asset {asset} is unknown to Airflow (DAG not parsed?)")
        self.asset_id = assets[0]["id"]

    def payload(self, e: dict) -> dict:
        p = (e.get("extra") or {}).get("payload")
        if isinstance(p, str):  # KafkaSharedStreamTrigger: the message's value as text
            try:
                after = json.loads(p).get("after") or {}
            except ValueError:
                return {}
            return {"id": after.get("id"), "tag": after.get("e2e")}
        return p or {}

    def events(self) -> list[dict]:
        evs = self.api.pages(f"/api/v2/assets/events?asset_id={self.asset_id}", "asset_events")
        return [e for e in evs if self.payload(e).get("tag") == self.tag]

    def per_event(self) -> dict[int, int]:
        out: dict[int, int] = {}
        for e in self.events():
            i = self.payload(e)["id"]
            out[i] = out.get(i, 0) + 1
        return out

    def runs(self) -> dict[str, set]:
        """run id -> the event ids of the asset events it consumed."""
        out = {}
        for r in self.api.pages(f"/api/v2/dags/{self.dag_id}/dagRuns", "dag_runs"):
            ups = self.api.call("GET", f"/api/v2/dags/{self.dag_id}/dagRuns/" + urllib.parse.quote(r["dag_run_id"], safe="") + "/upstreamAssetEvents")
            ids = {self.payload(u).get("id") for u in ups["asset_events"] if self.payload(u).get("tag") == self.tag}
            if ids:
                out[r["dag_run_id"]] = ids
        return out


def tally(per_event: dict[int, int], runs: dict[str, set] | None, ids: range, where: dict | None = None, commit: dict | None = None) -> dict:
    """lost: no asset event/run although the group committed past the event's offset (gone for
    good); waiting: none yet, the event still at or after the committed offset (in Kafka, not
    consumed when the run ended); without_run: an asset event but no run yet."""
    missing = [i for i in ids if per_event.get(i, 0) == 0]
    out = {"asset_events": sum(per_event.get(i, 0) for i in ids),
           "duplicated": sum(1 for i in ids if per_event.get(i, 0) > 1)}
    if where is not None and commit is not None:
        out["lost"] = sum(1 for i in missing if where[i][1] < commit.get(where[i][0], 0))
        out["waiting"] = len(missing) - out["lost"]
    else:
        out["lost"] = len(missing)
    if runs is not None:
        mine = [r & set(ids) for r in runs.values()]
        mine = [r for r in mine if r]
        out["runs"] = len(mine)
        out["merged"] = sum(len(r) - 1 for r in mine if len(r) > 1)
        in_runs = set().union(*mine) if mine else set()
        out["without_run"] = sum(1 for i in ids if per_event.get(i, 0) > 0 and i not in in_runs)
    return out


def settle(sides: list[ProviderSide], ids: range, quiet: float, cap: float, step=None) -> float:
    """Poll until no side's count of asset events for ids changes for `quiet` seconds after
    step() has nothing left to do, at most `cap` seconds. Returns the seconds taken."""
    start, last, seen = time.time(), time.time(), None
    while time.time() - start < cap:
        busy = step(time.time() - start) if step else False
        if busy:
            last = time.time()  # quiet counts from the last kill or restart
        try:
            now = tuple(sum(s.per_event().get(i, 0) for i in ids) for s in sides)
        except urllib.error.HTTPError:
            now = seen  # the 500 above, for longer than call() waits: poll again
        if now != seen:
            seen, last = now, time.time()
        if not busy and time.time() - last > quiet:
            break
        time.sleep(3)
    return time.time() - start


def providers(api: API, a, tag: str, base: int) -> list[dict]:
    sides = [ProviderSide(api, "await", "kafka_compare_events", "compare_kafka_provider", tag),
             ProviderSide(api, "shared", "kafka_compare_shared_events", "compare_kafka_shared", tag)]
    topics = [a.provider_topic, a.shared_topic]
    kill_ids, paused_ids = range(1, a.events + 1), range(a.events + 1, a.events + a.paused + 1)

    # Phase kills: the same events on both topics, the same triggerer kills, one broker restart.
    for s in sides:
        api.pause(s.dag_id, False)
    where: dict = {}
    produce(a.brokers, topics, kill_ids, tag, base, where)
    span = max(a.events * 2.0, 30.0)  # the await trigger handles about one event per 2 s
    kill_at = sorted(random.uniform(5, span) for _ in range(a.kills))
    broker_at = [span / 2] if a.broker_restart else []

    def step(t: float) -> bool:
        """Kill or restart what is due; true while anything was done or is still to do."""
        acted = False
        if kill_at and t >= kill_at[0]:
            kill_at.pop(0)
            restart_triggerer(a)
            print(f"providers: triggerer SIGKILLed and restarted at {t:.0f} s", flush=True)
            acted = True
        if broker_at and t >= broker_at[0]:
            broker_at.pop(0)
            restart_broker(a, "providers")
            acted = True
        return acted or bool(kill_at or broker_at)

    # 120 s of quiet after the last kill: a SIGKILLed consumer stays a member of its group until
    # its session times out (45 s by default), and its successor waits for that rebalance.
    kill_secs = settle(sides, kill_ids, 120, a.cap, step)

    # Phase paused: events arrive while the DAG is paused; unpaused after a wait.
    for s in sides:
        api.pause(s.dag_id, True)
    # The dag-processor drops a paused DAG's asset watchers at its next parse of the file
    # (every 10 s here); events in that window still become asset events, then none do.
    time.sleep(30)
    produce(a.brokers, topics, paused_ids, tag, base, where)
    settle(sides, paused_ids, 30, 120)
    while_paused = [tally(s.per_event(), None, paused_ids)["asset_events"] for s in sides]
    for s in sides:
        api.pause(s.dag_id, False)
    paused_secs = settle(sides, range(1, a.events + a.paused + 1), 60, 300)
    time.sleep(20)  # the scheduler's runs for the last asset events
    # Everything is read once, at the end: a slow side gets the whole sitting.
    out = []
    for s, topic, group, wp in zip(sides, topics, ("compare-provider-" + tag, "compare-shared-" + tag), while_paused):
        commit, per, runs = committed(a.brokers, group, topic), s.per_event(), s.runs()
        out.append({"side": s.name, "phase": "kills", "events": a.events, "kills": a.kills, "broker_restarts": 1 if a.broker_restart else 0,
                    **tally(per, runs, kill_ids, where[topic], commit), "seconds": round(kill_secs)})
        out.append({"side": s.name, "phase": "paused", "events": a.paused, "kills": 0, "broker_restarts": 0,
                    "asset_events_while_paused": wp, **tally(per, runs, paused_ids, where[topic], commit), "seconds": round(paused_secs)})
    return out


def kafkatx(api: API, a, tag: str, base: int) -> list[dict]:
    api.pause("process_customer", True)  # runs are created and stay queued: nothing needs dagservice
    kill_ids, paused_ids = range(1, a.events + 1), range(a.events + 1, a.events + a.paused + 1)
    group = "compare-kafkatx-" + tag
    args = [a.dagtrigger, "--brokers", a.brokers, "--database-url", a.database_url, "--topic", a.kafkatx_topic,
            "--group", group, "--airflow-url", api.url, "--dag-id", "process_customer",
            "--airflow-username", env("AIRFLOW_USERNAME"), "--airflow-password-file", env("AIRFLOW_PASSWORD_FILE"),
            "--instance-id", "compare-1", "--session-timeout", "10s", "--batch-size", "1"]
    log = open(a.dagtrigger_log, "a")
    log_start = log.tell()

    def runs() -> dict[int, int]:
        per: dict[int, int] = {}
        for r in api.pages("/api/v2/dags/process_customer/dagRuns", "dag_runs"):
            if (r.get("conf") or {}).get("e2e") == tag:
                per[r["conf"]["id"]] = per.get(r["conf"]["id"], 0) + 1
        return per

    def until_idle() -> dict:
        out = subprocess.run(args + ["--exit-when-idle", "5s"], stdout=subprocess.PIPE, stderr=log, timeout=600)
        return json.loads(out.stdout.decode().strip().splitlines()[-1]) if out.stdout.strip() else {}

    where: dict = {}
    produce(a.brokers, [a.kafkatx_topic], kill_ids, tag, base, where)
    start = time.time()
    for k in range(a.kills):
        p = subprocess.Popen(args, stdout=subprocess.DEVNULL, stderr=log)
        time.sleep(random.uniform(2.5, 5.0))
        if a.broker_restart and k == a.kills // 2:
            restart_broker(a, "kafkatx")
            time.sleep(random.uniform(1.0, 3.0))
        p.send_signal(signal.SIGKILL)
        p.wait()
    summary = until_idle()
    secs = time.time() - start
    c = tally(runs(), None, kill_ids)
    out = [{"side": "kafkatx", "phase": "kills", "events": a.events, "kills": a.kills, "broker_restarts": 1 if a.broker_restart else 0,
            "asset_events": None, "runs": sum(runs().get(i, 0) for i in kill_ids), "lost": c["lost"], "duplicated": c["duplicated"],
            "merged": 0, "seconds": round(secs), "dead_lettered": summary.get("dead_lettered")}]

    produce(a.brokers, [a.kafkatx_topic], paused_ids, tag, base, where)
    start = time.time()
    summary = until_idle()
    secs = time.time() - start
    per = runs()
    c = tally(per, None, paused_ids)
    queued = sum(1 for r in api.pages("/api/v2/dags/process_customer/dagRuns?state=queued", "dag_runs")
                 if (r.get("conf") or {}).get("e2e") == tag and r["conf"]["id"] in paused_ids)
    log.flush()
    with open(a.dagtrigger_log) as f:
        f.seek(log_start)
        warned = sum(1 for line in f if "Airflow reports the DAG paused" in line)
    out.append({"side": "kafkatx", "phase": "paused", "events": a.paused, "kills": 0, "broker_restarts": 0,
                "asset_events": None, "runs": sum(per.get(i, 0) for i in paused_ids), "queued_while_paused": queued,
                "lost": c["lost"], "duplicated": c["duplicated"], "merged": 0, "seconds": round(secs),
                "paused_warnings_logged": warned, "dead_lettered": summary.get("dead_lettered")})
    commit = committed(a.brokers, group, a.kafkatx_topic)
    per = runs()
    for r, ids in zip(out, (kill_ids, paused_ids)):
        c = tally(per, None, ids, where[a.kafkatx_topic], commit)
        r["lost"], r["waiting"] = c["lost"], c["waiting"]
    return out


def main() -> None:
    ap = argparse.ArgumentParser()
    for name in ("brokers", "database-url", "dagtrigger", "state", "envsh", "airflow-bin", "provider-topic", "shared-topic",
                 "kafkatx-topic", "triggerer-log", "dagtrigger-log", "tag"):
        ap.add_argument("--" + name, required=True)
    ap.add_argument("--events", type=int, default=30)
    ap.add_argument("--kills", type=int, default=3)
    ap.add_argument("--paused", type=int, default=5, help="events that arrive while the DAG is paused")
    ap.add_argument("--broker-restart", default="", help="a shell command that SIGKILLs the script's own broker and brings it back; none: no broker restart")
    ap.add_argument("--cap", type=float, default=600, help="at most this many seconds for the providers' kills phase")
    a = ap.parse_args()
    api = API()
    create_topics(a.brokers, [a.kafkatx_topic])
    base = random.randrange(1, 1 << 30) * 64
    results = providers(api, a, a.tag, base) + kafkatx(api, a, a.tag, base + (1 << 40))
    print()
    cols = ("side", "phase", "events", "kills", "broker_restarts", "asset_events", "runs", "lost", "waiting", "duplicated", "merged", "without_run", "seconds")
    print(" ".join(f"{c:>12}" for c in cols))
    for r in results:
        print(" ".join(f"{'-' if r.get(c) is None else r.get(c):>12}" for c in cols))
    print(f"API calls repeated after a timeout or a 500: {api.retried}")
    print(json.dumps(results))


if __name__ == "__main__":
    main()
