# scripts/dev-services.d/kafka2.sh — a second dev broker of another Apache Kafka line (sourced by
# scripts/dev-services; start it with `scripts/dev-services up kafka2`).
#
# up      Starts one more combined KRaft broker+controller, of version KAFKA2_VERSION (default
#         4.1.2), plain listeners only, beside the main broker: its own ports, state (kafka2.*),
#         storage, server.properties and logs under .dev/kafka2, the same settings as the main
#         broker (scripts/dev-services, kafka_config), jars from the per-version cache
#         .dev/kafka/libs-<version>. Like the main broker it resumes on its data after `down`
#         or a crash, and its storage is keyed by version: another KAFKA2_VERSION formats its
#         own. `make test` starts it after the main suite to run a subset of the tests against
#         another Kafka line (Makefile, test-kafka2), then stops it.
# down    Stops it (its data stays for the next `up kafka2`).
# env     KAFKA2_BOOTSTRAP_SERVERS (127.0.0.1:PORT) and KAFKA2_VERSION (the version running).

kafka2_default_version=4.1.2

# Runs "$@" with the Kafka functions pointed at the second broker (call it in a subshell).
kafka2_instance() {
  KS=kafka2
  KAFKA_DIR=$DEV/kafka2
  KAFKA_MODE=plain
  KAFKA_VERSION=${KAFKA2_VERSION:-$kafka2_default_version}
  "$@"
}

kafka2_up() {
  # shellcheck disable=SC2317 # called through kafka2_instance
  kafka2_start() {
    if kafka_running && [[ $(state_get kafka2.version) == "$(kafka_wanted_version)" ]]; then
      log "kafka2: Apache Kafka $(state_get kafka2.version) already running: $(state_get kafka2.bootstrap) (pid $(state_get kafka2.pid))"
    else
      kafka_start
    fi
  }
  (kafka2_instance kafka2_start) || die "kafka2: the second broker did not start (logs in $DEV/kafka2/logs)"
}

kafka2_down() {
  (kafka2_instance kafka_stop)
}

kafka2_running() { (kafka2_instance kafka_running); }
kafka2_started() { [[ -n $(state_get kafka2.pid) ]]; }

kafka2_status() {
  if kafka2_running; then
    echo "kafka2: running Apache Kafka $(state_get kafka2.version) at $(state_get kafka2.bootstrap) on $(state_get kafka2.storage) storage (pid $(state_get kafka2.pid), logs $DEV/kafka2/logs)"
  else
    echo "kafka2: stopped (scripts/dev-services up kafka2)"; return 3
  fi
}

kafka2_env() {
  echo "export KAFKA2_BOOTSTRAP_SERVERS=$(squote "$(state_get kafka2.bootstrap)")"
  echo "export KAFKA2_VERSION=$(squote "$(state_get kafka2.version)")"
}
