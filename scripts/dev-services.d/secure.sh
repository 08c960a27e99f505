# scripts/dev-services.d/secure.sh — the dev broker with a SASL_SSL listener and ACLs (sourced by
# scripts/dev-services; start it with `scripts/dev-services up secure`).
#
# up      Restarts the dev broker in its secure listener configuration (when it runs plain) and
#         leaves it so: beside the PLAINTEXT listener a SECURE listener (SASL_SSL, mechanism
#         SCRAM-SHA-512) on 127.0.0.1 on a free port. The secure configuration has its own
#         storage (.dev/kafka/data-<version>-secure, server-<version>-secure.properties), so switching between plain
#         and secure resumes or formats the other's storage and never fails on it.
#         - TLS: a CA and a broker certificate (RSA 2048, 10 years) are generated once with
#           openssl under .dev/kafka/secure (ca.pem, broker.p12). The broker certificate names
#           only IP 127.0.0.1 (subjectAltName): connecting by any other name, `localhost`
#           included, is a hostname mismatch, which librdkafka 2.x rejects by default
#           (ssl.endpoint.identification.algorithm=https) — the tests use that.
#         - Users (SCRAM-SHA-512, created at format time, random passwords kept in
#           .dev/kafka/secure, mode 600): `kafkatx`, the application's user, and `admin`.
#         - ACLs, enforced by StandardAuthorizer (allow.everyone.if.no.acl.found=false): kafkatx
#           may do everything on every topic, group and transactional id and on the cluster
#           (create topics, idempotent writes), except what is named with the prefix
#           `denied.` (topics, groups, transactional ids): DENY, for tests of authorization
#           failures. Super users: admin, and ANONYMOUS — the principal of the PLAINTEXT and
#           CONTROLLER listeners, so every plaintext client keeps working unchanged.
#         Bare `up` leaves a running secure broker alone, and brings a crashed or stopped one
#         back in the secure configuration (its storage and ports), saying so.
# down    `down secure` restarts the broker plain (its plain storage), or, when it is not
#         running, makes the next `up` start the plain one; `down` stops it.
# env     KAFKA_SECURE_BOOTSTRAP_SERVERS (127.0.0.1:PORT of the SASL_SSL listener) and
#         KAFKA_SECURE_CONFIG_FILE: librdkafka properties for user kafkatx (security.protocol,
#         sasl.mechanism, sasl.username, sasl.password, ssl.ca.location). Status and env never
#         print a password; the file holds it (mode 600).

SECURE_DIR=$KAFKA_DIR/secure

# Print a random password (hex: safe in properties, JAAS and the format tool's syntax).
secure_random() { od -An -N16 -tx1 /dev/urandom | tr -d ' \n'; }

# The CA, the broker's keystore and the users' passwords, made once.
secure_material() {
  mkdir -p "$SECURE_DIR"; chmod 700 "$SECURE_DIR"
  local d=$SECURE_DIR u
  for u in kafkatx admin keystore; do
    [[ -s $d/$u.password ]] || { (umask 077; secure_random >"$d/$u.password"); }
  done
  if [[ ! -s $d/ca.pem || ! -s $d/broker.p12 ]]; then
    command -v openssl >/dev/null 2>&1 || die "openssl not found: needed once to make the secure listener's certificates"
    log "secure: generating a CA and a broker certificate for 127.0.0.1 under $d"
    ( umask 077
      openssl req -x509 -newkey rsa:2048 -nodes -days 3650 -subj "/CN=kafkatx dev CA" \
        -keyout "$d/ca.key" -out "$d/ca.pem" 2>/dev/null \
      && openssl req -newkey rsa:2048 -nodes -subj "/CN=127.0.0.1" \
        -keyout "$d/broker.key" -out "$d/broker.csr" 2>/dev/null \
      && printf 'subjectAltName=IP:127.0.0.1\nextendedKeyUsage=serverAuth\n' >"$d/broker.ext" \
      && openssl x509 -req -in "$d/broker.csr" -CA "$d/ca.pem" -CAkey "$d/ca.key" -CAcreateserial \
        -days 3650 -extfile "$d/broker.ext" -out "$d/broker.pem" 2>/dev/null \
      && openssl pkcs12 -export -in "$d/broker.pem" -inkey "$d/broker.key" -certfile "$d/ca.pem" \
        -name broker -passout "file:$d/keystore.password" -out "$d/broker.p12" ) \
      || die "openssl failed to make the secure listener's certificates"
    chmod 644 "$d/ca.pem"
  fi
  # The client's properties (user kafkatx).
  ( umask 077; cat >"$d/client.properties.tmp" <<EOF
# librdkafka properties for the dev broker's SASL_SSL listener (scripts/dev-services.d/secure.sh)
security.protocol=SASL_SSL
sasl.mechanism=SCRAM-SHA-512
sasl.username=kafkatx
sasl.password=$(cat "$d/kafkatx.password")
ssl.ca.location=$d/ca.pem
EOF
  ) && mv "$d/client.properties.tmp" "$d/client.properties"
}

# Broker settings of the secure configuration, printed after the plain ones (later keys win).
# Called by kafka_fresh with $port and $cport set.
secure_broker_config() {
  secure_material
  local sport
  sport=$(pick_port "$(state_get kafka.secure_port)")
  while [[ $sport == "$port" || $sport == "$cport" ]]; do sport=$(pick_port ""); done
  state_put kafka.secure_port "$sport"
  cat <<EOF
# --- secure listener (scripts/dev-services.d/secure.sh) ---
listeners=PLAINTEXT://127.0.0.1:$port,CONTROLLER://127.0.0.1:$cport,SECURE://127.0.0.1:$sport
advertised.listeners=PLAINTEXT://127.0.0.1:$port,CONTROLLER://127.0.0.1:$cport,SECURE://127.0.0.1:$sport
listener.security.protocol.map=CONTROLLER:PLAINTEXT,PLAINTEXT:PLAINTEXT,SECURE:SASL_SSL
listener.name.secure.sasl.enabled.mechanisms=SCRAM-SHA-512
listener.name.secure.scram-sha-512.sasl.jaas.config=org.apache.kafka.common.security.scram.ScramLoginModule required username="admin" password="$(cat "$SECURE_DIR/admin.password")";
listener.name.secure.ssl.keystore.type=PKCS12
listener.name.secure.ssl.keystore.location=$SECURE_DIR/broker.p12
listener.name.secure.ssl.keystore.password=$(cat "$SECURE_DIR/keystore.password")
listener.name.secure.ssl.client.auth=none
authorizer.class.name=org.apache.kafka.metadata.authorizer.StandardAuthorizer
allow.everyone.if.no.acl.found=false
super.users=User:ANONYMOUS;User:admin
EOF
}

# The format tool's arguments that create the SCRAM users (appended to the array named $1).
secure_format_args() {
  local -n out=$1
  local u
  for u in kafkatx admin; do
    out+=(--add-scram "SCRAM-SHA-512=[name=$u,password=$(cat "$SECURE_DIR/$u.password")]")
  done
}

# After the secure broker answers (plaintext port $1): its ACLs, once per storage.
secure_after_start() {
  local port=$1 cid
  cid=$(sed -n 's/^cluster.id=//p' "$(kafka_data_dir)/meta.properties" 2>/dev/null | head -1)
  [[ -n $cid && $(state_get kafka.secure_acls) == "$cid" ]] && return 0
  local log=$KAFKA_DIR/logs/acls.log p=(--bootstrap-server "127.0.0.1:$port" --add --force)
  {
    kafka_tool org.apache.kafka.tools.AclCommand "${p[@]}" --allow-principal User:kafkatx --operation All \
      --topic '*' --group '*' --transactional-id '*' --cluster \
    && kafka_tool org.apache.kafka.tools.AclCommand "${p[@]}" --deny-principal User:kafkatx --operation All \
      --resource-pattern-type prefixed --topic denied. --group denied. --transactional-id denied.
  } >"$log" 2>&1 || { tail -20 "$log" >&2; log "secure: setting the ACLs failed (log $log)"; return 1; }
  state_put kafka.secure_acls "$cid"
  log "secure: SASL_SSL listener at 127.0.0.1:$(state_get kafka.secure_port) (SCRAM-SHA-512, ACLs enforced)"
}

secure_started() { [[ $(state_get kafka.mode) == secure ]]; }
secure_running() { secure_started && kafka_running && port_in_use "$(state_get kafka.secure_port)"; }

secure_up() {
  if kafka_external; then die "secure: KAFKA_BOOTSTRAP_SERVERS names another broker; the secure listener is the dev broker's (unset it)"; fi
  secure_running || die "secure: the broker is not running in its secure configuration (logs in $KAFKA_DIR/logs)"
}

secure_down() {
  # `down secure` alone: back to the plain configuration. With the broker stopped too, nothing.
  secure_started || return 0
  if ((NAMED && !WANT_KAFKA)) && kafka_running; then
    log "secure: restarting the broker without its secure listener"
    KAFKA_MODE=plain
    kafka_start
  elif ((NAMED && !WANT_KAFKA)); then
    state_put kafka.mode plain
    log "secure: the broker is not running; the next 'scripts/dev-services up' starts the plain configuration"
  fi
}

secure_status() {
  if secure_running; then
    echo "secure: running SASL_SSL (SCRAM-SHA-512, ACLs) at 127.0.0.1:$(state_get kafka.secure_port) (client properties $SECURE_DIR/client.properties)"
  else
    echo "secure: stopped (scripts/dev-services up secure)"; return 3
  fi
}

secure_env() {
  echo "export KAFKA_SECURE_BOOTSTRAP_SERVERS=$(squote "127.0.0.1:$(state_get kafka.secure_port)")"
  echo "export KAFKA_SECURE_CONFIG_FILE=$(squote "$SECURE_DIR/client.properties")"
}
