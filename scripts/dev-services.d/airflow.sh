# scripts/dev-services.d/airflow.sh — a real Apache Airflow 3 for the end-to-end tests (sourced by
# scripts/dev-services; start it with `scripts/dev-services up airflow`).
#
# up      Installs apache-airflow[postgres]==$AIRFLOW_VERSION (default 3.3.2) from PyPI into a
#         virtual environment under .dev/airflow/venv, pinned by scripts/airflow/constraints.txt
#         (once; reinstalled when that file changes). Then, afresh on every start: a metadata
#         database kafkatx_airflow on the dev PostgreSQL (kafkatx_airflow_HASH, keyed by this
#         checkout's path, when DATABASE_URL points at another checkout's PostgreSQL; dropped and
#         created, `airflow db migrate`), and four components as their own processes — api-server (127.0.0.1 on a
#         free port), scheduler (LocalExecutor), dag-processor and triggerer (log servers off:
#         nothing else listens) — with SimpleAuthManager (user admin, a random password in
#         .dev/airflow/home/passwords.json), examples/dags as the DAG folder, new DAG files
#         found every 5 s ([dag_processor] refresh_interval; Airflow's default is 300 s) and
#         DAGs unpaused at creation. It is ready when the api-server answers /api/v2/monitor/
#         health and the scheduler, dag-processor and triggerer report healthy there.
# down    Stops the four components (SIGTERM to each process group, SIGKILL after 30 s).
# env     AIRFLOW_URL (api-server base URL), AIRFLOW_USERNAME, AIRFLOW_PASSWORD_FILE (the
#         password alone), AIRFLOW_HOME, AIRFLOW_BIN (the venv's `airflow`), and
#         AIRFLOW_DAGSERVICE_ADDR: the HOST:PORT where the example DAG's tasks call
#         examples/dagservice (the tasks inherit DAGSERVICE_URL from the scheduler, so the port
#         is chosen here; whoever runs dagservice listens there).
#
# Environment: AIRFLOW_PYTHON (interpreter for the venv; default python3.11, else python3 when
# it is 3.10–3.13), AIRFLOW_VERSION, AIRFLOW_DAGS_FOLDER (default examples/dags). The components
# inherit the caller's environment (AIRFLOW_CONN_* connections, for example). Logs:
# .dev/airflow/logs/COMPONENT.log.
#
# The constraints file is a `pip freeze` of a clean install (upstream's constraint files are
# not reachable from every build machine). To move to another Airflow version:
#   python3.11 -m venv /tmp/af && /tmp/af/bin/pip install 'apache-airflow[postgres]==X.Y.Z'
#   /tmp/af/bin/pip freeze > scripts/airflow/constraints.txt   # keep the two header lines
# then change AIRFLOW_VERSION's default below.

AIRFLOW_DIR=$DEV/airflow
AIRFLOW_VENV=$AIRFLOW_DIR/venv
AIRFLOW_CONSTRAINTS=$REPO/scripts/airflow/constraints.txt
AIRFLOW_COMPONENTS=(api-server scheduler dag-processor triggerer)
# The metadata database: kafkatx_airflow on this checkout's own PostgreSQL; on a PostgreSQL shared
# through DATABASE_URL (another checkout's), one keyed by this checkout's path, so that `up` here
# never drops the metadata of an Airflow another checkout runs on the same server.
airflow_db() {
  if pg_external; then
    echo "kafkatx_airflow_$(printf '%s' "$REPO" | sha256sum | cut -c1-8)"
  else
    echo kafkatx_airflow
  fi
}

airflow_python() {
  if [[ -n ${AIRFLOW_PYTHON:-} ]]; then echo "$AIRFLOW_PYTHON"; return; fi
  if command -v python3.11 >/dev/null 2>&1; then echo python3.11; return; fi
  local v
  v=$(python3 -c 'import sys; print("%d.%d" % sys.version_info[:2])' 2>/dev/null || true)
  case $v in 3.10|3.11|3.12|3.13) echo python3 ;; *) die "Airflow 3 needs Python 3.10-3.13 (python3.11 or AIRFLOW_PYTHON)" ;; esac
}

# Install once; the stamp holds the version and the constraints' hash.
airflow_install() {
  local want stamp
  want="${AIRFLOW_VERSION:-3.3.2} $(sha256sum "$AIRFLOW_CONSTRAINTS" | cut -c1-16)"
  stamp=$AIRFLOW_VENV/.kafkatx-complete
  if [[ -x $AIRFLOW_VENV/bin/airflow && -f $stamp && $(cat "$stamp") == "$want" ]]; then return 0; fi
  local py; py=$(airflow_python)
  log "installing apache-airflow[postgres]==${AIRFLOW_VERSION:-3.3.2} into $AIRFLOW_VENV (once; pinned by $AIRFLOW_CONSTRAINTS)"
  rm -rf "$AIRFLOW_VENV"; mkdir -p "$AIRFLOW_DIR"
  "$py" -m venv "$AIRFLOW_VENV" || die "cannot create a virtual environment with $py"
  "$AIRFLOW_VENV/bin/pip" install -q --disable-pip-version-check -c "$AIRFLOW_CONSTRAINTS" \
    "apache-airflow[postgres]==${AIRFLOW_VERSION:-3.3.2}" >"$AIRFLOW_DIR/install.log" 2>&1 \
    || { tail -20 "$AIRFLOW_DIR/install.log" >&2; die "pip install of Airflow failed (log: $AIRFLOW_DIR/install.log)"; }
  printf '%s\n' "$want" >"$stamp"
}

# The dev PostgreSQL's URL with another database.
airflow_pg_url() {
  local base; if pg_external; then base=$DATABASE_URL; else base=$(state_get pg.url); fi
  python3 -c 'import sys,urllib.parse as u; p=u.urlparse(sys.argv[1]); print(u.urlunparse(p._replace(path="/"+sys.argv[2], query="")))' "$base" "$1"
}

# The environment every component (and the tasks, through the scheduler) runs with.
airflow_write_env() {
  local port=$1 svcport=$2 home=$AIRFLOW_DIR/home secret conn
  secret=$(head -c 32 /dev/urandom | od -An -tx1 | tr -d ' \n')
  conn=$(airflow_pg_url "$(airflow_db)"); conn=${conn/#postgres:/postgresql+psycopg2:}; conn=${conn/#postgresql:/postgresql+psycopg2:}
  cat >"$AIRFLOW_DIR/env.sh" <<EOF
# Generated by scripts/dev-services (airflow.sh); sourced before each Airflow component.
export AIRFLOW_HOME=$(squote "$home")
export AIRFLOW__CORE__DAGS_FOLDER=$(squote "${AIRFLOW_DAGS_FOLDER:-$REPO/examples/dags}")
export AIRFLOW__CORE__LOAD_EXAMPLES=False
export AIRFLOW__CORE__EXECUTOR=LocalExecutor
export AIRFLOW__CORE__PARALLELISM=8
export AIRFLOW__CORE__DAGS_ARE_PAUSED_AT_CREATION=False
export AIRFLOW__CORE__AUTH_MANAGER=airflow.api_fastapi.auth.managers.simple.simple_auth_manager.SimpleAuthManager
export AIRFLOW__CORE__SIMPLE_AUTH_MANAGER_USERS=admin:admin
export AIRFLOW__CORE__SIMPLE_AUTH_MANAGER_PASSWORDS_FILE=$(squote "$home/passwords.json")
export AIRFLOW__CORE__EXECUTION_API_SERVER_URL=http://127.0.0.1:$port/execution/
export AIRFLOW__API__HOST=127.0.0.1
export AIRFLOW__API__PORT=$port
export AIRFLOW__API__BASE_URL=http://127.0.0.1:$port
export AIRFLOW__API_AUTH__JWT_SECRET=$secret
export AIRFLOW__DATABASE__SQL_ALCHEMY_CONN=$(squote "$conn")
export AIRFLOW__DAG_PROCESSOR__REFRESH_INTERVAL=5
export AIRFLOW__DAG_PROCESSOR__MIN_FILE_PROCESS_INTERVAL=10
export AIRFLOW__SCHEDULER__SCHEDULER_HEARTBEAT_SEC=2
export AIRFLOW__SCHEDULER__TASK_QUEUED_TIMEOUT=120
export AIRFLOW__LOGGING__BASE_LOG_FOLDER=$(squote "$AIRFLOW_DIR/logs/tasks")
export DAGSERVICE_URL=http://127.0.0.1:$svcport
EOF
}

airflow_pid_ok() { pid_alive "${1:-}"; }

airflow_health() {
  local port; port=$(state_get airflow.port)
  [[ -n $port ]] || return 1
  curl -fsS -m 5 "http://127.0.0.1:$port/api/v2/monitor/health" 2>/dev/null
}

# Healthy: every component alive and the api-server reporting scheduler, dag-processor and
# triggerer healthy.
airflow_healthy() {
  local c
  for c in "${AIRFLOW_COMPONENTS[@]}"; do airflow_pid_ok "$(state_get "airflow.pid.$c")" || return 1; done
  airflow_health | python3 -c '
import json, sys
h = json.load(sys.stdin)
sys.exit(0 if all((h.get(k) or {}).get("status") == "healthy" for k in ("metadatabase", "scheduler", "dag_processor", "triggerer")) else 1)' 2>/dev/null
}

airflow_started() { [[ -n $(state_get airflow.port) ]]; }
airflow_running() { airflow_started && airflow_healthy; }

airflow_up() {
  if airflow_running; then
    log "Airflow already running: http://127.0.0.1:$(state_get airflow.port)"
    return 0
  fi
  airflow_down_quiet
  command -v curl >/dev/null 2>&1 || die "curl is needed to check Airflow's health"
  airflow_install
  local port svcport
  port=$(pick_port "$(state_get airflow.port)")
  svcport=$(pick_port "$(state_get airflow.dagservice_port)")
  [[ $svcport != "$port" ]] || svcport=$(pick_port "")
  rm -rf "$AIRFLOW_DIR/home" "$AIRFLOW_DIR/logs"; mkdir -p "$AIRFLOW_DIR/home" "$AIRFLOW_DIR/logs"
  local pw; pw=$(head -c 18 /dev/urandom | base64 | tr '+/' '-_')
  printf '{"admin": "%s"}\n' "$pw" >"$AIRFLOW_DIR/home/passwords.json"
  printf '%s\n' "$pw" >"$AIRFLOW_DIR/home/admin.password"
  chmod 600 "$AIRFLOW_DIR/home/passwords.json" "$AIRFLOW_DIR/home/admin.password"
  airflow_write_env "$port" "$svcport"

  local pgurl; if pg_external; then pgurl=$DATABASE_URL; else pgurl=$(state_get pg.url); fi
  local db; db=$(airflow_db)
  psql "$pgurl" -qAt -v ON_ERROR_STOP=1 -c "DROP DATABASE IF EXISTS $db WITH (FORCE)" -c "CREATE DATABASE $db" >/dev/null \
    || die "cannot create database $db for Airflow's metadata"
  log "migrating Airflow's metadata database ($db)"
  ( . "$AIRFLOW_DIR/env.sh"; "$AIRFLOW_VENV/bin/airflow" db migrate ) >"$AIRFLOW_DIR/logs/migrate.log" 2>&1 \
    || { tail -20 "$AIRFLOW_DIR/logs/migrate.log" >&2; die "airflow db migrate failed (log: $AIRFLOW_DIR/logs/migrate.log)"; }

  state_put airflow.port "$port"
  state_put airflow.dagservice_port "$svcport"
  local c args
  for c in "${AIRFLOW_COMPONENTS[@]}"; do
    case $c in
      api-server) args=(api-server --host 127.0.0.1 --port "$port" --workers 1) ;;
      scheduler|triggerer) args=("$c" --skip-serve-logs) ;;
      *) args=("$c") ;;
    esac
    # setsid: each component leads its own process group (its children: task processes,
    # uvicorn workers), which `down` signals as a whole. 9>&-: not the dev-services lock.
    ( . "$AIRFLOW_DIR/env.sh"; exec setsid "$AIRFLOW_VENV/bin/airflow" "${args[@]}" ) \
      </dev/null >"$AIRFLOW_DIR/logs/$c.log" 2>&1 9>&- &
    state_put "airflow.pid.$c" "$!"
  done
  local deadline=$((SECONDS + 180))
  while ((SECONDS < deadline)); do
    for c in "${AIRFLOW_COMPONENTS[@]}"; do
      airflow_pid_ok "$(state_get "airflow.pid.$c")" \
        || { tail -30 "$AIRFLOW_DIR/logs/$c.log" >&2; airflow_down_quiet; die "Airflow's $c exited during startup (log: $AIRFLOW_DIR/logs/$c.log)"; }
    done
    if airflow_healthy; then
      log "Apache Airflow $("$AIRFLOW_VENV/bin/python" -c 'import airflow; print(airflow.__version__)' 2>/dev/null) started: http://127.0.0.1:$port (logs $AIRFLOW_DIR/logs)"
      return 0
    fi
    sleep 1
  done
  airflow_health >&2 || true
  airflow_down_quiet
  die "Airflow was not healthy within 180 s (logs in $AIRFLOW_DIR/logs)"
}

# Stop every component's process group: SIGTERM, then SIGKILL after 30 s.
airflow_down_quiet() {
  local c pid
  for c in "${AIRFLOW_COMPONENTS[@]}"; do
    pid=$(state_get "airflow.pid.$c")
    if airflow_pid_ok "$pid"; then kill -TERM -- "-$pid" 2>/dev/null || true; fi
  done
  for _ in $(seq 1 300); do
    local alive=0
    for c in "${AIRFLOW_COMPONENTS[@]}"; do
      pid=$(state_get "airflow.pid.$c")
      [[ -n $pid ]] && kill -0 -- "-$pid" 2>/dev/null && alive=1
    done
    ((alive)) || break
    sleep 0.1
  done
  for c in "${AIRFLOW_COMPONENTS[@]}"; do
    pid=$(state_get "airflow.pid.$c")
    if [[ -n $pid ]]; then kill -KILL -- "-$pid" 2>/dev/null || true; fi
    state_rm "airflow.pid.$c"
  done
  return 0
}

airflow_down() {
  airflow_started || return 0
  airflow_down_quiet
  state_rm airflow.port
  log "Airflow stopped"
}

airflow_status() {
  if airflow_running; then
    echo "airflow: running at http://127.0.0.1:$(state_get airflow.port) (pids $(for c in "${AIRFLOW_COMPONENTS[@]}"; do printf '%s=%s ' "$c" "$(state_get "airflow.pid.$c")"; done | sed 's/ $//'), logs $AIRFLOW_DIR/logs)"
  else
    echo "airflow: stopped or unhealthy"; return 3
  fi
}

airflow_env() {
  echo "export AIRFLOW_URL=$(squote "http://127.0.0.1:$(state_get airflow.port)")"
  echo "export AIRFLOW_USERNAME=admin"
  echo "export AIRFLOW_PASSWORD_FILE=$(squote "$AIRFLOW_DIR/home/admin.password")"
  echo "export AIRFLOW_HOME=$(squote "$AIRFLOW_DIR/home")"
  echo "export AIRFLOW_BIN=$(squote "$AIRFLOW_VENV/bin/airflow")"
  echo "export AIRFLOW_DAGSERVICE_ADDR=$(squote "127.0.0.1:$(state_get airflow.dagservice_port)")"
}
