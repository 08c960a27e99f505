# scripts/dev-services.d/outage.sh — a broker of its own for the tests that kill or freeze the
# broker (sourced by scripts/dev-services; start it with `scripts/dev-services up outage`).
#
# up      Starts one more combined KRaft broker+controller of the main broker's version
#         (KAFKA_VERSION), plain listeners only, beside the main broker: its own ports, state
#         (outage.*), storage, server.properties and logs under .dev/kafka-outage, the main
#         broker's settings (scripts/dev-services, kafka_config). Like the main broker it resumes
#         on its data after `down` or a crash: testenv.KillBroker SIGKILLs it and brings it back
#         with `scripts/dev-services up outage` (KAFKATX_BROKER_KILL_SERVICE=outage). `make test`
#         runs test-outages against it while the main suite runs on the main broker, then stops it.
# down    Stops it (its data stays for the next `up outage`).
# env     KAFKATX_OUTAGE_BOOTSTRAP_SERVERS (127.0.0.1:PORT).

# Runs "$@" with the Kafka functions pointed at the outage broker (call it in a subshell).
outage_instance() {
  KS=outage
  KAFKA_DIR=$DEV/kafka-outage
  KAFKA_MODE=plain
  "$@"
}

outage_up() {
  # shellcheck disable=SC2317 # called through outage_instance
  outage_start() {
    if kafka_running && [[ $(state_get outage.version) == "$(kafka_wanted_version)" ]]; then
      log "outage: Apache Kafka $(state_get outage.version) already running: $(state_get outage.bootstrap) (pid $(state_get outage.pid))"
    else
      kafka_start
    fi
  }
  (outage_instance outage_start) || die "outage: the outage broker did not start (logs in $DEV/kafka-outage/logs)"
}

outage_down() {
  (outage_instance kafka_stop)
}

outage_running() { (outage_instance kafka_running); }
outage_started() { [[ -n $(state_get outage.pid) ]]; }

outage_status() {
  if outage_running; then
    echo "outage: running Apache Kafka $(state_get outage.version) at $(state_get outage.bootstrap) on $(state_get outage.storage) storage (pid $(state_get outage.pid), logs $DEV/kafka-outage/logs)"
  else
    echo "outage: stopped (scripts/dev-services up outage)"; return 3
  fi
}

outage_env() {
  echo "export KAFKATX_OUTAGE_BOOTSTRAP_SERVERS=$(squote "$(state_get outage.bootstrap)")"
}
