# scripts/dev-services.d/connect.sh — Kafka Connect with the Debezium PostgreSQL connector, for
# the CDC tests. Sourced by scripts/dev-services; started only when named:
#
#   scripts/dev-services up connect     (brings up PostgreSQL and the broker first)
#   scripts/dev-services status connect
#   scripts/dev-services env connect    -> export KAFKA_CONNECT_URL=http://127.0.0.1:PORT
#   scripts/dev-services down connect
#
# What runs: one Kafka Connect 4.3.1 worker in standalone mode
# (org.apache.kafka.connect.cli.ConnectStandalone) with Debezium 3.6.1.Final's PostgreSQL
# connector on its classpath, its REST API on 127.0.0.1 on a free port. The jars are fetched once
# with Maven from scripts/connect/pom.xml and cached in .dev/connect/libs. It starts with no
# connector: tests register theirs over the REST API (POST /connectors) and delete them.
#
# The worker writes to the dev broker (or KAFKA_BOOTSTRAP_SERVERS), converts keys and values with
# the JSON converter, schemas off by default (a connector may override key.converter.* and
# value.converter.*), creates its topics itself (1 partition, replication factor 1), and keeps
# source offsets in .dev/connect/data/offsets, flushed every CONNECT_OFFSET_FLUSH_MS (default
# 1000) ms. The offsets file survives a restart (`up connect` after a kill -9 resumes from it,
# as a production worker would); `down connect` deletes it.
#
# The connector reads PostgreSQL's logical replication (plugin pgoutput), so the source cluster
# needs wal_level=logical and a role with REPLICATION: the dev cluster has both (pg_start). With
# an external DATABASE_URL whose server lacks wal_level=logical, `up connect` fails and says so.
#
# Environment: CONNECT_HEAP_OPTS (default -Xms256m -Xmx768m), CONNECT_OFFSET_FLUSH_MS.

CONNECT_DIR=$DEV/connect
CONNECT_LIBS=$CONNECT_DIR/libs
CONNECT_POM=$REPO/scripts/connect/pom.xml

# "<connect.version> <debezium.version>" as the pom names them; the cache is reused while equal.
connect_wanted() {
  local c d
  c=$(sed -n 's#.*<connect\.version>\(.*\)</connect\.version>.*#\1#p' "$CONNECT_POM" | head -1)
  d=$(sed -n 's#.*<debezium\.version>\(.*\)</debezium\.version>.*#\1#p' "$CONNECT_POM" | head -1)
  echo "$c $d"
}

connect_fetch() {
  local want; want=$(connect_wanted)
  if [[ -f $CONNECT_LIBS/.complete && $(cat "$CONNECT_LIBS/.complete") == "$want" ]]; then
    return 0
  fi
  command -v mvn >/dev/null 2>&1 || die "mvn (Maven) not found: needed once to fetch the Kafka Connect and Debezium jars"
  local tmp=$CONNECT_DIR/libs.tmp
  rm -rf "$tmp"; mkdir -p "$CONNECT_DIR"
  log "fetching Kafka Connect and Debezium jars ($want) with Maven (once; cached in $CONNECT_LIBS)"
  mvn -B -q -Dstyle.color=never -f "$CONNECT_POM" dependency:copy-dependencies "-DoutputDirectory=$tmp" 2>&1 \
    | sed 's/\x1b\[[0-9;]*m//g' >&2 || die "mvn -f $CONNECT_POM dependency:copy-dependencies failed"
  compgen -G "$tmp/connect-runtime-*.jar" >/dev/null && compgen -G "$tmp/debezium-connector-postgres-*.jar" >/dev/null \
    || die "Maven fetched no connect-runtime or debezium-connector-postgres jar into $tmp"
  printf '%s\n' "$want" >"$tmp/.complete"
  rm -rf "$CONNECT_LIBS"; mv "$tmp" "$CONNECT_LIBS"
}

# The PostgreSQL URL the connector reads (the dev cluster's, or DATABASE_URL).
connect_pg_url() {
  if pg_external; then echo "$DATABASE_URL"; else state_get pg.url; fi
}

# Fail clearly when the source cannot serve logical replication.
connect_check_source() {
  local url wal psql
  url=$(connect_pg_url)
  [[ -n $url ]] || die "connect: no PostgreSQL to read (scripts/dev-services up, or set DATABASE_URL)"
  psql=$(find_pg_bin)/psql
  [[ -x $psql ]] || psql=psql
  wal=$("$psql" -X -At -d "$url" -c 'SHOW wal_level' 2>&1) \
    || die "connect: cannot ask PostgreSQL for wal_level: $wal"
  if [[ $wal != logical ]]; then
    die "connect: PostgreSQL runs with wal_level=$wal; Debezium's PostgreSQL connector needs wal_level=logical (set it in postgresql.conf and restart the server; the cluster scripts/dev-services starts has it: 'scripts/dev-services down postgres && scripts/dev-services up')"
  fi
  local rep
  rep=$("$psql" -X -At -d "$url" -c 'SELECT rolreplication OR rolsuper FROM pg_roles WHERE rolname = current_user' 2>&1) || rep=?
  [[ $rep == t ]] || die "connect: the PostgreSQL role of $(printf '%s' "$url" | sed 's#://[^@]*@#://***@#') lacks REPLICATION (ALTER ROLE ... REPLICATION)"
}

connect_pid_ok() {
  local pid=${1:-}
  pid_alive "$pid" && tr '\0' ' ' <"/proc/$pid/cmdline" 2>/dev/null | grep -q 'ConnectStandalone'
}

# Does the REST API answer on $1 with a Connect version?
connect_answers() {
  local out
  out=$(timeout 5 bash -c 'exec 3<>"/dev/tcp/127.0.0.1/$0" || exit 1
    printf "GET / HTTP/1.0\r\nHost: 127.0.0.1\r\n\r\n" >&3; cat <&3' "$1" 2>/dev/null) || return 1
  [[ $out == "HTTP/1."?" 200"* && $out == *'"version"'* ]]
}

connect_started() { [[ -n $(state_get connect.pid) ]]; }

connect_running() {
  local pid port
  pid=$(state_get connect.pid); port=$(state_get connect.port)
  [[ -n $port ]] && connect_pid_ok "$pid" && connect_answers "$port"
}

connect_up() {
  if connect_running; then
    log "Kafka Connect already running: http://127.0.0.1:$(state_get connect.port) (pid $(state_get connect.pid))"
    return 0
  fi
  connect_check_source
  connect_fetch
  local old; old=$(state_get connect.pid)
  if connect_pid_ok "$old"; then connect_kill "$old"; fi

  local port bootstrap data logs conf
  port=$(pick_port "$(state_get connect.port)")
  if kafka_external; then bootstrap=$KAFKA_BOOTSTRAP_SERVERS; else bootstrap=$(state_get kafka.bootstrap); fi
  [[ -n $bootstrap ]] || die "connect: no Kafka broker (scripts/dev-services up)"
  data=$CONNECT_DIR/data; logs=$CONNECT_DIR/logs; conf=$CONNECT_DIR/worker.properties
  mkdir -p "$data" "$logs"
  : >"$logs/connect.log"
  cat >"$conf" <<CONF
# Generated by scripts/dev-services.d/connect.sh: a standalone worker for the CDC tests.
bootstrap.servers=$bootstrap
listeners=http://127.0.0.1:$port
rest.advertised.host.name=127.0.0.1
rest.advertised.port=$port
key.converter=org.apache.kafka.connect.json.JsonConverter
value.converter=org.apache.kafka.connect.json.JsonConverter
key.converter.schemas.enable=false
value.converter.schemas.enable=false
offset.storage.file.filename=$data/offsets
offset.flush.interval.ms=${CONNECT_OFFSET_FLUSH_MS:-1000}
# Connectors may create their topics (topic.creation.default.* in the connector's config).
topic.creation.enable=true
# Plugins are found through their ServiceLoader manifests (KIP-898), not by scanning every
# class of the classpath (15 s of a 24 s start on 2 cores).
plugin.discovery=service_load
CONF

  # setsid: the worker survives the calling shell; `down connect` (or a test's kill -9) stops it.
  # 9>&-: it must not inherit the lock of this command.
  # shellcheck disable=SC2086
  setsid "$(java_bin)" ${CONNECT_HEAP_OPTS:--Xms256m -Xmx768m} -XX:+UseG1GC -Djava.awt.headless=true \
    "-Dconnect.logs.dir=$logs" "-Dlog4j2.configurationFile=$REPO/scripts/connect/log4j2.properties" \
    -cp "$CONNECT_LIBS/*" org.apache.kafka.connect.cli.ConnectStandalone "$conf" \
    </dev/null >"$logs/stdout.log" 2>&1 9>&- &
  local pid=$!
  state_put connect.pid "$pid"
  state_put connect.port "$port"

  local deadline=$((SECONDS + 120))
  while ((SECONDS < deadline)); do
    connect_pid_ok "$pid" || { tail -n 30 "$logs/stdout.log" "$logs/connect.log" >&2 || true; die "Kafka Connect exited during startup (logs in $logs)"; }
    if connect_answers "$port"; then
      log "Kafka Connect $(connect_wanted | cut -d' ' -f1) with Debezium $(connect_wanted | cut -d' ' -f2) started: http://127.0.0.1:$port (pid $pid, logs $logs)"
      return 0
    fi
    sleep 0.3
  done
  tail -30 "$logs/connect.log" >&2 || true
  connect_kill "$pid"
  die "Kafka Connect's REST API did not answer within 120 s (logs in $logs)"
}

# Stop a worker: SIGTERM (it stops its tasks and flushes offsets), SIGKILL after 30 s.
connect_kill() {
  local pid=$1
  connect_pid_ok "$pid" || return 0
  kill -TERM "$pid" 2>/dev/null || true
  for _ in $(seq 1 300); do connect_pid_ok "$pid" || return 0; sleep 0.1; done
  kill -KILL "$pid" 2>/dev/null || true
  for _ in $(seq 1 50); do connect_pid_ok "$pid" || return 0; sleep 0.1; done
}

connect_down() {
  local pid; pid=$(state_get connect.pid)
  if connect_pid_ok "$pid"; then
    connect_kill "$pid"
    log "Kafka Connect stopped"
  fi
  rm -rf "$CONNECT_DIR/data"
  state_rm connect.pid
}

connect_status() {
  if connect_running; then
    echo "connect: running at http://127.0.0.1:$(state_get connect.port) (pid $(state_get connect.pid))"
  elif connect_started; then
    echo "connect: not answering (pid $(state_get connect.pid), logs $CONNECT_DIR/logs)"; return 3
  else
    echo "connect: stopped"; return 3
  fi
}

connect_env() {
  echo "export KAFKA_CONNECT_URL=$(squote "http://127.0.0.1:$(state_get connect.port)")"
}
