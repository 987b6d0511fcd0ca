#!/usr/bin/env bash
# Readiness and liveness of the example workers, as an orchestrator sees them: each worker runs from a settings
# file with `[worker] health_addr`, against its own PostgreSQL cluster and its own broker (a private moto, a
# private Service Bus emulator), so that both can be stopped under it without touching the services the other
# tests use. For each broker:
#
#   ready (200) -> PostgreSQL stopped: /readyz 503 "fail database", /livez still 200
#               -> PostgreSQL started again: 200
#               -> broker stopped: 503 "fail queue", /livez still 200
#               -> broker started again (its queue recreated): 200
#               -> SIGTERM: the worker exits 0
#
# Needs: the workspace built (target/debug), PostgreSQL's binaries (initdb, pg_ctl), moto installed by
# scripts/moto.sh (.build/venv-moto), curl, python3. Run as root (the cluster runs as the postgres user) or
# as a user that may run initdb. Fails loudly when any of it is missing. KEEP=1 keeps the logs' folder.
set -euo pipefail
root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
cd "$root"
bin=target/debug

fail() {
  echo "readiness: FAILED: $*" >&2
  exit 1
}
say() { echo "readiness: $*" >&2; }

command -v curl >/dev/null || fail "curl is not installed"
pgbin=$(ls -d /usr/lib/postgresql/*/bin 2>/dev/null | sort -V | tail -n 1 || true)
[[ -x $pgbin/initdb && -x $pgbin/pg_ctl ]] || fail "PostgreSQL's initdb/pg_ctl not found under /usr/lib/postgresql"
[[ -x .build/venv-moto/bin/moto_server ]] || fail "moto is not installed: run scripts/moto.sh start once"
for b in sqs-crm-worker servicebus-crm-worker servicebus-producer sqs-producer txinbox-sb-emulator; do
  [[ -x $bin/$b ]] || fail "$bin/$b is missing: cargo build --workspace first"
done

work=$(mktemp -d)
chmod 755 "$work"
pids=()
pg_up=0
cleanup() {
  for p in "${pids[@]}"; do kill "$p" 2>/dev/null || true; done
  [[ $pg_up == 1 ]] && as_pg "$pgbin/pg_ctl" -D "$work/pg" -m immediate stop >/dev/null 2>&1 || true
  if [[ -n ${KEEP:-} ]]; then echo "readiness: kept $work" >&2; else rm -rf "$work"; fi
}
trap cleanup EXIT

free_port() { python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])'; }
as_pg() {
  if [[ $(id -u) == 0 ]]; then runuser -u postgres -- "$@"; else "$@"; fi
}

# --- a PostgreSQL cluster of our own ----------------------------------------------------------------------
pg_port=$(free_port)
mkdir -p "$work/pg"
[[ $(id -u) == 0 ]] && chown postgres "$work/pg"
as_pg "$pgbin/initdb" -D "$work/pg" -A trust -U postgres >/dev/null || fail "initdb failed"
pg_start() {
  as_pg "$pgbin/pg_ctl" -D "$work/pg" -o "-p $pg_port -k $work/pg -c listen_addresses=127.0.0.1" \
    -l "$work/pg/log" -w start >/dev/null || fail "pg_ctl start failed: $(tail -n 5 "$work/pg/log")"
  pg_up=1
}
pg_stop() {
  as_pg "$pgbin/pg_ctl" -D "$work/pg" -m fast -w stop >/dev/null || fail "pg_ctl stop failed"
  pg_up=0
}
pg_start
pg_url="postgres://postgres@127.0.0.1:$pg_port/postgres"

# wait_code ADDR PATH CODE [TEXT]: polls http://ADDR/PATH (at most 60 s) until it answers CODE (and its body
# holds TEXT).
wait_code() {
  local addr=$1 path=$2 code=$3 text=${4:-} got body
  for _ in $(seq 1 120); do
    got=$(curl -s -o "$work/body" -w '%{http_code}' --max-time 5 "http://$addr/$path" || true)
    body=$(cat "$work/body" 2>/dev/null || true)
    if [[ $got == "$code" && ( -z $text || $body == *"$text"* ) ]]; then
      return 0
    fi
    sleep 0.5
  done
  fail "http://$addr/$path: expected $code${text:+ with '$text'}, last answer $got: $body"
}

# check_worker NAME HEALTH_ADDR PID STOP_BROKER START_BROKER: the sequence above.
check_worker() {
  local name=$1 addr=$2 pid=$3 stop_broker=$4 start_broker=$5
  wait_code "$addr" readyz 200 "ok database"
  wait_code "$addr" livez 200
  say "$name ready"
  pg_stop
  wait_code "$addr" readyz 503 "fail database"
  wait_code "$addr" livez 200
  say "$name: PostgreSQL stopped -> not ready, live"
  pg_start
  wait_code "$addr" readyz 200
  say "$name: PostgreSQL back -> ready"
  $stop_broker
  wait_code "$addr" readyz 503 "fail queue"
  wait_code "$addr" livez 200
  say "$name: broker stopped -> not ready, live"
  $start_broker
  wait_code "$addr" readyz 200
  say "$name: broker back -> ready"
  kill -0 "$pid" 2>/dev/null || fail "$name died: $(tail -n 5 "$work/$name.err")"
  kill -TERM "$pid"
  wait "$pid" || fail "$name exited with an error after SIGTERM: $(tail -n 5 "$work/$name.err")"
  say "$name ok"
}

# --- SQS on a private moto ----------------------------------------------------------------------------------
moto_port=$(free_port)
moto_pid=""
moto_start() {
  .build/venv-moto/bin/moto_server -H 127.0.0.1 -p "$moto_port" >"$work/moto.log" 2>&1 &
  moto_pid=$!
  pids+=("$moto_pid")
  for _ in $(seq 1 100); do
    curl -s -o /dev/null --max-time 1 "http://127.0.0.1:$moto_port/" && break
    sleep 0.1
  done
  # moto keeps nothing: the queue (and its DLQ) is created again, as a redeploy would.
  AWS_ENDPOINT_URL_SQS="http://127.0.0.1:$moto_port" "$bin/sqs-producer" --queue-name crm-ready --create \
    --times 1 >/dev/null 2>"$work/producer.err" || fail "sqs-producer --create: $(tail -n 3 "$work/producer.err")"
}
moto_stop() { kill "$moto_pid"; wait "$moto_pid" 2>/dev/null || true; }
export AWS_ACCESS_KEY_ID=testing AWS_SECRET_ACCESS_KEY=testing AWS_REGION=us-east-1
moto_start
sqs_health="127.0.0.1:$(free_port)"
cat >"$work/sqs.toml" <<EOF
[worker]
consumer = "crm-ready"
health_addr = "$sqs_health"

[sqs]
queue_url = "http://127.0.0.1:$moto_port/123456789012/crm-ready.fifo"
wait_time_seconds = 1
EOF
# The password-free URL still goes through the environment, as the settings docs advise for a real one.
TXINBOX_STORE__URL=$pg_url TXINBOX_STORE__MAX_CONNECTIONS=4 AWS_ENDPOINT_URL_SQS="http://127.0.0.1:$moto_port" \
  RUST_LOG=info "$bin/sqs-crm-worker" --config "$work/sqs.toml" >"$work/sqs.out" 2>"$work/sqs.err" &
sqs_pid=$!
pids+=("$sqs_pid")
check_worker sqs "$sqs_health" "$sqs_pid" moto_stop moto_start

# --- Service Bus on a private emulator ----------------------------------------------------------------------
sb_port=$(free_port)
sb_key=$(head -c 32 /dev/urandom | base64 | tr -d '\n')
sb_pid=""
sb_start() {
  rm -f "$work/sb.out"
  TXINBOX_SB_EMULATOR_SAS_KEY="$sb_key" RUST_LOG=warn "$bin/txinbox-sb-emulator" --listen "127.0.0.1:$sb_port" \
    --namespace ready --sas-key-name RootManageSharedAccessKey >"$work/sb.out" 2>"$work/sb.log" &
  sb_pid=$!
  pids+=("$sb_pid")
  for _ in $(seq 1 100); do
    grep -q '^listening on' "$work/sb.out" 2>/dev/null && break
    sleep 0.1
  done
  grep -q '^listening on' "$work/sb.out" || fail "the emulator did not start: $(tail -n 3 "$work/sb.log")"
  "$bin/servicebus-producer" --queue crm-ready --create-on-emulator >/dev/null 2>"$work/producer.err" ||
    fail "servicebus-producer --create-on-emulator: $(tail -n 3 "$work/producer.err")"
}
sb_stop() { kill "$sb_pid"; wait "$sb_pid" 2>/dev/null || true; }
export SERVICEBUS_CONNECTION_STRING="Endpoint=sb://ready.servicebus.windows.net/;SharedAccessKeyName=RootManageSharedAccessKey;SharedAccessKey=$sb_key"
export SERVICEBUS_ENDPOINT="http://127.0.0.1:$sb_port"
sb_start
sb_health="127.0.0.1:$(free_port)"
cat >"$work/sb.toml" <<EOF
[worker]
consumer = "crm-ready"
health_addr = "$sb_health"

[servicebus]
queue = "crm-ready"
dead_letter_to = "crm-ready-poison"
EOF
TXINBOX_STORE__URL=$pg_url TXINBOX_STORE__MAX_CONNECTIONS=4 RUST_LOG=info \
  "$bin/servicebus-crm-worker" --config "$work/sb.toml" >"$work/sb-worker.out" 2>"$work/servicebus.err" &
sb_worker=$!
pids+=("$sb_worker")
check_worker servicebus "$sb_health" "$sb_worker" sb_stop sb_start

say "ok: both workers' readiness followed PostgreSQL and their broker, and recovered"
