# scripts/dev-services.d/patroni.sh — a high-availability PostgreSQL: Patroni with one etcd and
# two PostgreSQL 15 nodes on 127.0.0.1 (sourced by scripts/dev-services; start it with
# `scripts/dev-services up patroni`). The failover tests drive it (kill -9 of the leader, a
# switchover) in both replication modes.
#
# up      Installs Debian's patroni, etcd-server and etcd-client packages with apt-get when
#         `patroni` or `etcd` is missing (as root; otherwise it says what to install). Then, when
#         etcd is not running, starts afresh: one etcd member (v3 API) and two Patroni nodes,
#         node1 and node2, of scope `kafkatx`, each running PostgreSQL 15 (PG_BIN) on a free port
#         of 127.0.0.1 with its REST API on another. Patroni runs as the `postgres` OS user as
#         root (data under /var/tmp/kafkatx-dev-<hash>/patroni), as the caller otherwise
#         (.dev/patroni). The first node to take the leader lock runs initdb; the other
#         pg_basebackups from it and streams. When etcd runs and a node's Patroni does not (a
#         test killed it), only that node is started again: it rejoins as a replica (pg_rewind).
#         Ready once one node answers GET /primary and the other GET /replica with 200.
#         DCS settings: ttl 10 s, loop_wait 2 s, retry_timeout 4 s (a leader killed with -9 is
#         replaced after about 10 s), maximum_lag_on_failover 64 MiB (a lagging asynchronous
#         replica is still promoted: the commits it lacks are lost, which the tests want to see),
#         use_slots, use_pg_rewind, wal_level logical, and a permanent logical slot (Patroni's
#         `slots`) for the dev database's WAL outbox (kafkatx_kafkatx_dev_kafkatx, pgoutput),
#         declared once the database and the outbox's empty publication exist: Patroni creates
#         it on the leader, copies it to the replica and advances it there, so it survives a
#         failover.
#         fsync is off: the tests kill processes, never the machine.
#         Replication mode: asynchronous; PATRONI_SYNCHRONOUS_MODE=true at `up` sets Patroni's
#         synchronous_mode (the replica becomes the synchronous standby; a running cluster is
#         switched with patronictl edit-config), =false switches back.
#         The login role is the dev one (kafkatx_dev / kafkatx_dev, CREATEDB REPLICATION), with
#         its database kafkatx_dev; the superuser is postgres / patroni-dev-super.
# down    Stops both Patroni nodes (SIGTERM: each stops its PostgreSQL), then etcd.
# env     PATRONI_DATABASE_URL: both nodes in one URL with target_session_attrs=read-write (pgx
#         tries the hosts in order and keeps the one that accepts writes: the leader);
#         PATRONI_REST_URLS: the nodes' REST APIs (comma-separated, node1 first);
#         PATRONICTL_CONFIG_FILE: node1's Patroni configuration (for patronictl -c);
#         PATRONI_DIR: the directory of node1/ and node2/ (data/, patroni.pid, patroni.log).

PATRONI_NODES=(node1 node2)
PATRONI_SUPER_PASSWORD=patroni-dev-super

patroni_base() {
  if is_root; then echo "/var/tmp/kafkatx-dev-$REPO_HASH/patroni"; else echo "$DEV/patroni"; fi
}

patroni_as_owner() { if is_root; then runuser -u postgres -- "$@"; else "$@"; fi; }

patroni_install() {
  command -v patroni >/dev/null 2>&1 && command -v etcd >/dev/null 2>&1 && command -v etcdctl >/dev/null 2>&1 && return 0
  is_root || die "patroni or etcd not found: install them (Debian: apt-get install patroni etcd-server etcd-client) or run as root"
  log "patroni: installing Debian's patroni, etcd-server and etcd-client packages (apt-get, once)"
  local pkgs=(patroni etcd-server etcd-client)
  { DEBIAN_FRONTEND=noninteractive apt-get install -y -q --no-install-recommends "${pkgs[@]}" \
    || { apt-get update -q && DEBIAN_FRONTEND=noninteractive apt-get install -y -q --no-install-recommends "${pkgs[@]}"; }
  } >"$DEV/patroni-install.log" 2>&1 || { tail -5 "$DEV/patroni-install.log" >&2; die "apt-get install ${pkgs[*]} failed"; }
  # The packages enable system services (etcd, patroni); ours are separate and nothing of
  # theirs is started in a container (policy-rc.d), but stop them where something was.
  if command -v service >/dev/null 2>&1; then
    service patroni stop >/dev/null 2>&1 || true; service etcd stop >/dev/null 2>&1 || true
  fi
  command -v patroni >/dev/null 2>&1 && command -v etcd >/dev/null 2>&1 || die "patroni or etcd still not found after apt-get install"
}

# Free, distinct ports for etcd (client, peer) and the nodes (PostgreSQL, REST), preferring the
# previous ones.
patroni_pick_ports() {
  local key p taken=" "
  for key in etcd.port etcd.peer_port node1.pg_port node1.rest_port node2.pg_port node2.rest_port; do
    p=$(pick_port "$(state_get "patroni.$key")")
    while [[ $taken == *" $p "* ]]; do p=$(pick_port ""); done
    taken+="$p "
    state_put "patroni.$key" "$p"
  done
}

patroni_etcd_url() { echo "http://127.0.0.1:$(state_get patroni.etcd.port)"; }

patroni_etcd_healthy() {
  local port; port=$(state_get patroni.etcd.port)
  [[ -n $port ]] && curl -fsS --max-time 3 "http://127.0.0.1:$port/health" 2>/dev/null | grep -q '"health":"true"'
}

patroni_etcd_running() { pid_alive "$(state_get patroni.etcd.pid)" && patroni_etcd_healthy; }

patroni_node_pid() { cat "$(patroni_base)/$1/patroni.pid" 2>/dev/null || true; }

patroni_node_alive() { launched_alive "$(patroni_node_pid "$1")"; }

# GET a node's REST endpoint ($2: primary, replica, ...) and succeed on 200.
patroni_rest_ok() {
  local port; port=$(state_get "patroni.$1.rest_port")
  [[ -n $port ]] && curl -fsS -o /dev/null --max-time 3 "http://127.0.0.1:$port/$2" 2>/dev/null
}

# The node holding the leader lock (answering GET /primary), or nothing.
patroni_leader() {
  local n
  for n in "${PATRONI_NODES[@]}"; do patroni_rest_ok "$n" primary && { echo "$n"; return 0; }; done
  return 1
}

# Superuser SQL on node $1 over its Unix socket.
patroni_psql() {
  local n=$1; shift
  patroni_as_owner "$(find_pg_bin)/psql" -X -q -At -h "$(patroni_base)/$n" -p "$(state_get "patroni.$n.pg_port")" \
    -U postgres -d postgres -v ON_ERROR_STOP=1 "$@" 2>/dev/null
}

# One node leads and every other answers GET /replica and streams from it.
patroni_ready() {
  local leader n; leader=$(patroni_leader) || return 1
  for n in "${PATRONI_NODES[@]}"; do
    [[ $n == "$leader" ]] || patroni_rest_ok "$n" replica || return 1
  done
  [[ $(patroni_psql "$leader" -c "SELECT count(*) FROM pg_stat_replication WHERE state = 'streaming'") == $((${#PATRONI_NODES[@]} - 1)) ]]
}

patroni_started() { [[ -n $(state_get patroni.etcd.pid) ]]; }

# Running: etcd answers and a node leads (a replica may be restarting).
patroni_running() { patroni_etcd_running && patroni_leader >/dev/null; }

patroni_url() {
  local hosts="" n
  for n in "${PATRONI_NODES[@]}"; do hosts+="${hosts:+,}127.0.0.1:$(state_get "patroni.$n.pg_port")"; done
  echo "postgres://$PG_USER:$PG_PASSWORD@$hosts/$PG_DB?sslmode=disable&target_session_attrs=read-write"
}

patroni_write_config() {
  local n=$1 base; base=$(patroni_base)
  local pg rest; pg=$(state_get "patroni.$n.pg_port"); rest=$(state_get "patroni.$n.rest_port")
  mkdir -p "$base/$n"
  cat >"$base/$n/patroni.yml" <<EOF
# Generated by scripts/dev-services.d/patroni.sh
scope: kafkatx
name: $n
log:
  level: INFO
restapi:
  listen: 127.0.0.1:$rest
  connect_address: 127.0.0.1:$rest
etcd3:
  hosts: 127.0.0.1:$(state_get patroni.etcd.port)
bootstrap:
  dcs:
    ttl: 10
    loop_wait: 2
    retry_timeout: 4
    maximum_lag_on_failover: 67108864
    synchronous_mode: ${PATRONI_SYNCHRONOUS_MODE:-false}
    postgresql:
      use_pg_rewind: true
      use_slots: true
      parameters:
        wal_level: logical
        hot_standby: "on"
        max_connections: 200
        max_replication_slots: 16
        max_wal_senders: 16
        wal_log_hints: "on"
        wal_keep_size: 256MB
        fsync: "off"
        password_encryption: scram-sha-256
  initdb:
    - encoding: UTF8
    - locale: C.UTF-8
  pg_hba:
    - local all all trust
    - local replication all trust
    - host replication all 127.0.0.1/32 scram-sha-256
    - host all all 127.0.0.1/32 scram-sha-256
postgresql:
  listen: 127.0.0.1:$pg
  connect_address: 127.0.0.1:$pg
  data_dir: $base/$n/data
  bin_dir: $(find_pg_bin)
  pgpass: $base/$n/pgpass
  authentication:
    replication: {username: replicator, password: patroni-dev-replication}
    superuser: {username: postgres, password: $PATRONI_SUPER_PASSWORD}
    rewind: {username: rewind_user, password: patroni-dev-rewind}
  parameters:
    unix_socket_directories: '$base/$n'
    shared_buffers: 128MB
    log_min_messages: warning
EOF
}

patroni_start_etcd() {
  local base; base=$(patroni_base)
  local port peer; port=$(state_get patroni.etcd.port); peer=$(state_get patroni.etcd.peer_port)
  mkdir -p "$base/etcd"
  # setsid: it survives the calling shell; 9>&-: not the lock of this command.
  setsid etcd --name e1 --data-dir "$base/etcd/data" \
    --listen-client-urls "http://127.0.0.1:$port" --advertise-client-urls "http://127.0.0.1:$port" \
    --listen-peer-urls "http://127.0.0.1:$peer" --initial-advertise-peer-urls "http://127.0.0.1:$peer" \
    --initial-cluster "e1=http://127.0.0.1:$peer" --initial-cluster-state new \
    --initial-cluster-token "kafkatx-dev-$REPO_HASH" \
    </dev/null >"$base/etcd/etcd.log" 2>&1 9>&- &
  state_put patroni.etcd.pid "$!"
  local deadline=$((SECONDS + 30))
  while ((SECONDS < deadline)); do
    patroni_etcd_healthy && return 0
    launched_alive "$(state_get patroni.etcd.pid)" || break
    sleep 0.2
  done
  tail -n 20 "$base/etcd/etcd.log" >&2 || true
  die "etcd did not become healthy within 30 s (log $base/etcd/etcd.log)"
}

# Start node $1's Patroni (it starts, bootstraps or rejoins its PostgreSQL).
patroni_start_node() {
  local n=$1 base; base=$(patroni_base)
  patroni_write_config "$n"
  mkdir -p "$base/$n"
  if is_root; then
    chown root:root "$(dirname "$base")" "$base"; chmod 755 "$(dirname "$base")" "$base"
    chown -R postgres:postgres "$base/$n"
  fi
  chmod 700 "$base/$n"
  rm -f "$base/$n/patroni.pid" # the new process writes its own: never mistake the old one for it
  # A killed postmaster leaves its pid file; Patroni checks the pid is not alive and starts it.
  # shellcheck disable=SC2016 # $$ and $0 expand in the inner shell
  setsid "$(is_root && echo runuser || echo env)" $(is_root && echo "-u postgres --") \
    sh -c 'echo $$ >"$0/patroni.pid"; exec patroni "$0/patroni.yml"' "$base/$n" \
    </dev/null >>"$base/$n/patroni.log" 2>&1 9>&- &
}

patroni_up() {
  patroni_install
  local base n; base=$(patroni_base)
  if ! patroni_etcd_running; then
    patroni_down
    rm -rf "$base"; mkdir -p "$base"
    patroni_pick_ports
    patroni_start_etcd
    log "etcd $(etcd --version | awk '/etcd Version/ {print $3}') started at $(patroni_etcd_url)"
  fi
  local started=()
  for n in "${PATRONI_NODES[@]}"; do
    if ! patroni_node_alive "$n"; then
      patroni_start_node "$n"; started+=("$n")
      # The first node of a new cluster takes the leader lock and runs initdb before the
      # other is started, so the other clones it rather than racing for the lock.
      if [[ $n == node1 && ! -d $base/node2/data ]]; then
        local d=$((SECONDS + 60))
        until patroni_rest_ok node1 primary || ((SECONDS > d)); do sleep 0.3; done
      fi
    fi
  done
  local deadline=$((SECONDS + 120))
  until patroni_ready; do
    if ((SECONDS > deadline)); then
      for n in "${PATRONI_NODES[@]}"; do tail -n 15 "$base/$n/patroni.log" >&2 || true; done
      die "Patroni: no leader and streaming replica within 120 s (logs $base/node*/patroni.log)"
    fi
    for n in "${started[@]}"; do
      local pid; pid=$(patroni_node_pid "$n")
      [[ -z $pid ]] || launched_alive "$pid" || { tail -n 20 "$base/$n/patroni.log" >&2; die "Patroni $n exited (log $base/$n/patroni.log)"; }
    done
    sleep 0.3
  done
  patroni_bootstrap_role
  patroni_wait_slot_copies
  patroni_sync_mode
  local leader; leader=$(patroni_leader)
  log "Patroni $(patroni --version 2>/dev/null | awk '{print $2}') cluster up (leader $leader${started[*]:+; started ${started[*]}}): $(patroni_url)"
}

# The dev role and database on the leader (once; the replica gets them by replication).
patroni_bootstrap_role() {
  local leader; leader=$(patroni_leader)
  if [[ $(patroni_psql "$leader" -c "SELECT count(*) FROM pg_roles WHERE rolname = '$PG_USER'") != 1 ]]; then
    patroni_psql "$leader" -c "CREATE ROLE $PG_USER LOGIN CREATEDB REPLICATION PASSWORD '$PG_PASSWORD'" >/dev/null \
      || die "Patroni: cannot create role $PG_USER on $leader"
  fi
  if [[ $(patroni_psql "$leader" -c "SELECT count(*) FROM pg_database WHERE datname = '$PG_DB'") != 1 ]]; then
    patroni_psql "$leader" -c "CREATE DATABASE $PG_DB OWNER $PG_USER" >/dev/null || die "Patroni: cannot create database $PG_DB on $leader"
  fi
  # The WAL outbox's permanent slot, declared only once its (empty) publication exists: pgoutput
  # looks the publication up as of each change it decodes, so a slot older than the
  # publication fails on the changes in between ("publication ... does not exist").
  local slot="kafkatx_${PG_DB}_kafkatx" pub=kafkatx_outbox_kafkatx
  if [[ $(patroni_psql "$leader" -d "$PG_DB" -c "SELECT count(*) FROM pg_publication WHERE pubname = '$pub'") != 1 ]]; then
    patroni_psql "$leader" -d "$PG_DB" -c "CREATE PUBLICATION $pub" >/dev/null || die "Patroni: cannot create publication $pub"
  fi
  if ! patronictl -c "$(patroni_base)/node1/patroni.yml" show-config 2>/dev/null | grep -q "$slot:"; then
    patronictl -c "$(patroni_base)/node1/patroni.yml" edit-config --force -s "slots.$slot.type=logical" \
      -s "slots.$slot.database=$PG_DB" -s "slots.$slot.plugin=pgoutput" >/dev/null 2>&1 \
      || die "Patroni: patronictl edit-config (permanent slot $slot) failed"
  fi
}

# Wait until every replica holds the leader's permanent logical slots (Patroni restarts a
# replica's PostgreSQL once to copy them) and streams again.
patroni_wait_slot_copies() {
  local leader n want d=$((SECONDS + 120))
  while ((SECONDS < d)); do
    leader=$(patroni_leader) || { sleep 0.5; continue; }
    want=$(patroni_psql "$leader" -c "SELECT count(*) FROM pg_replication_slots WHERE slot_type = 'logical'")
    local ok=1
    for n in "${PATRONI_NODES[@]}"; do
      [[ $n == "$leader" ]] && continue
      [[ $(patroni_psql "$n" -c "SELECT count(*) FROM pg_replication_slots WHERE slot_type = 'logical'") == "$want" ]] || ok=0
    done
    ((ok)) && patroni_ready && return 0
    sleep 0.5
  done
  die "Patroni: the replica did not copy the leader's logical slots and stream again within 120 s"
}

# PATRONI_SYNCHRONOUS_MODE=true|false switches a running cluster's synchronous_mode.
patroni_sync_mode() {
  [[ -n ${PATRONI_SYNCHRONOUS_MODE:-} ]] || return 0
  local want=$PATRONI_SYNCHRONOUS_MODE cfg; cfg=$(patroni_base)/node1/patroni.yml
  [[ $want == true || $want == false ]] || die "PATRONI_SYNCHRONOUS_MODE=$want: want true or false"
  patronictl -c "$cfg" edit-config --force -s "synchronous_mode=$want" >/dev/null 2>&1 \
    || die "patronictl edit-config -s synchronous_mode=$want failed"
  local leader d=$((SECONDS + 30)) want_state=async
  [[ $want == true ]] && want_state=sync
  while ((SECONDS < d)); do
    leader=$(patroni_leader) && [[ $(patroni_psql "$leader" -c "SELECT string_agg(sync_state, ',') FROM pg_stat_replication") == "$want_state" ]] \
      && { log "Patroni: synchronous_mode $want ($want_state standby)"; return 0; }
    sleep 0.5
  done
  die "Patroni: the standby did not become $want_state within 30 s of synchronous_mode=$want"
}

patroni_down() {
  local base n pid; base=$(patroni_base)
  for n in "${PATRONI_NODES[@]}"; do
    pid=$(patroni_node_pid "$n")
    pid_alive "$pid" && kill -TERM "$pid" 2>/dev/null || true
  done
  for n in "${PATRONI_NODES[@]}"; do
    pid=$(patroni_node_pid "$n")
    for _ in $(seq 1 150); do pid_alive "$pid" || break; sleep 0.1; done
    pid_alive "$pid" && kill -KILL "$pid" 2>/dev/null || true
    # A postmaster whose Patroni was killed is still running (its parent is pid 1).
    local pm; pm=$(head -1 "$base/$n/data/postmaster.pid" 2>/dev/null || true)
    if pid_alive "$pm"; then
      patroni_as_owner "$(find_pg_bin)/pg_ctl" -D "$base/$n/data" -m immediate -w stop >/dev/null 2>&1 || kill -KILL "$pm" 2>/dev/null || true
    fi
  done
  pid=$(state_get patroni.etcd.pid)
  if pid_alive "$pid"; then
    kill -TERM "$pid" 2>/dev/null || true
    for _ in $(seq 1 100); do pid_alive "$pid" || break; sleep 0.1; done
    pid_alive "$pid" && kill -KILL "$pid" 2>/dev/null || true
    log "Patroni cluster and etcd stopped"
  fi
  state_rm patroni.etcd.pid
}

patroni_status() {
  if patroni_running; then
    echo "patroni: running (leader $(patroni_leader)) at $(patroni_url | sed 's#//[^@]*@#//#'), etcd $(patroni_etcd_url)"
  elif patroni_started; then
    echo "patroni: started but not ready (no leader with a streaming replica; scripts/dev-services up patroni)"; return 3
  else
    echo "patroni: stopped (scripts/dev-services up patroni)"; return 3
  fi
}

patroni_env() {
  local base rest="" n; base=$(patroni_base)
  for n in "${PATRONI_NODES[@]}"; do rest+="${rest:+,}http://127.0.0.1:$(state_get "patroni.$n.rest_port")"; done
  echo "export PATRONI_DATABASE_URL=$(squote "$(patroni_url)")"
  echo "export PATRONI_REST_URLS=$(squote "$rest")"
  echo "export PATRONICTL_CONFIG_FILE=$(squote "$base/node1/patroni.yml")"
  echo "export PATRONI_DIR=$(squote "$base")"
}
