#!/usr/bin/env bash
# Runs the example producers and workers as real processes against moto and the Service Bus emulator, stops
# each worker with SIGTERM, and checks its report: the resend is dropped by the broker's deduplication, the same
# follow-up under another event id is a business duplicate, and exactly one is applied.
#
# Called by scripts/test.sh after the services are up (it needs TXINBOX_SQS_ENDPOINT and the exports of
# scripts/sb-emulator.sh) and the workspace is built.
set -euo pipefail
root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
cd "$root"
bin=target/debug
: "${TXINBOX_SQS_ENDPOINT:?run scripts/moto.sh start first}"
: "${SERVICEBUS_ENDPOINT:?run scripts/sb-emulator.sh start first}"
work=$(mktemp -d)
prom_dir=""
cleanup_pids=()
cleanup() {
  for p in "${cleanup_pids[@]}"; do kill "$p" 2>/dev/null || true; done
  [[ -n $prom_dir ]] && bash scripts/prometheus.sh stop "$prom_dir" || true
  rm -rf "$work"
}
trap cleanup EXIT

fail() {
  echo "examples-smoke: FAILED: $*" >&2
  exit 1
}

# run_worker NAME WAIT_FOR EXPECTED_REPORT COMMAND...: starts a worker, waits (at most 60 s) until its log shows
# WAIT_FOR (the last outcome expected, in FIFO order), sends SIGTERM, and checks that it stopped cleanly and that
# the report it prints on the way out holds every `outcome=n` of EXPECTED_REPORT (space-separated).
run_worker() {
  local name=$1 wait_for=$2 expected=$3
  shift 3
  "$@" >"$work/$name.out" 2>"$work/$name.err" &
  local pid=$!
  for _ in $(seq 1 120); do
    cat "$work/$name.out" "$work/$name.err" | grep -q "$wait_for" && break
    kill -0 "$pid" 2>/dev/null || fail "$name died: $(tail -n 5 "$work/$name.out" "$work/$name.err")"
    sleep 0.5
  done
  kill -TERM "$pid"
  wait "$pid" || fail "$name exited with an error: $(tail -n 5 "$work/$name.err")"
  local report
  report=$(grep WorkerReport "$work/$name.out" || true)
  for outcome in $expected; do
    local key=${outcome%=*} n=${outcome#*=}
    [[ "$report " == *" $key=$n "* ]] || fail "$name: expected $key=$n in: $report"
  done
  cat "$work/$name.out" "$work/$name.err" | grep -q 'worker stopped' || fail "$name: no clean stop after SIGTERM"
  echo "examples-smoke: $name ok: $report" >&2
}

txinbox=target/debug/txinbox

# SQS FIFO on moto: the resend is dropped by the FIFO window, another id for the same follow-up is a business
# duplicate. Then the original event lands in the DLQ; `txinbox sqs redrive` moves it back with its identity
# and the inbox recognises it as already applied.
export AWS_ENDPOINT_URL_SQS=$TXINBOX_SQS_ENDPOINT AWS_ACCESS_KEY_ID=testing AWS_SECRET_ACCESS_KEY=testing AWS_REGION=us-east-1
q="crm-smoke-$$"
queue_url="$TXINBOX_SQS_ENDPOINT/123456789012/$q.fifo"
dlq_url="$TXINBOX_SQS_ENDPOINT/123456789012/$q-dlq.fifo"
"$bin/sqs-producer" --queue-name "$q" --create --times 2 >&2
"$bin/sqs-producer" --queue-name "$q" --id "evt-other-$$" >&2
RUST_LOG=info run_worker sqs 'business duplicate' 'applied=1 business_duplicate=1' \
  "$bin/sqs-crm-worker" --queue-url "$queue_url" --store "sqlite:$work/sqs.db"
"$bin/sqs-producer" --queue-name "$q-dlq" >&2
moved=$("$txinbox" sqs redrive --from "$dlq_url" --to "$queue_url")
[[ $moved == moved=1\ * ]] || fail "sqs redrive: $moved"
RUST_LOG=info run_worker sqs-after-redrive 'duplicate: already applied' 'duplicate=1' \
  "$bin/sqs-crm-worker" --queue-url "$queue_url" --store "sqlite:$work/sqs.db"

# SIGTERM mid-batch: 24 events in 24 groups (so up to 8 run at once); the worker is stopped as soon as the
# first task exists, then a second worker drains the queue (messages the stopped worker had received come back
# after their 6 s visibility timeout). Nothing may be lost and nothing applied twice:
# the two reports add up to 24 applied and the task table holds 24 rows for 24 distinct messages.
count_tasks() {
  python3 -c 'import sqlite3,sys
try:
    c = sqlite3.connect(sys.argv[1]); print(*c.execute("select count(*), count(distinct message_id) from crm_followup_tasks").fetchone())
except sqlite3.Error:
    print(0, 0)' "$1"
}
applied_in() { grep WorkerReport "$1" | grep -o ' applied=[0-9]*' | grep -o '[0-9]*$' || echo 0; }
q="crm-sigterm-$$"
"$bin/sqs-producer" --queue-name "$q" --create --opportunity op_0 --meeting m_0 >/dev/null 2>&1
for i in $(seq 1 23); do
  "$bin/sqs-producer" --queue-name "$q" --opportunity "op_$i" --meeting "m_$i" >/dev/null 2>&1
done
db="$work/sigterm.db"
"$bin/sqs-crm-worker" --queue-url "$TXINBOX_SQS_ENDPOINT/123456789012/$q.fifo" --store "sqlite:$db" --visibility-timeout 6 \
  >"$work/sigterm1.out" 2>&1 &
pid=$!
for _ in $(seq 1 600); do
  read -r n _ < <(count_tasks "$db")
  [[ $n -ge 1 ]] && break
  sleep 0.1
done
kill -TERM "$pid"
wait "$pid" || fail "the first worker exited with an error after SIGTERM"
first=$(applied_in "$work/sigterm1.out")
"$bin/sqs-crm-worker" --queue-url "$TXINBOX_SQS_ENDPOINT/123456789012/$q.fifo" --store "sqlite:$db" --visibility-timeout 6 \
  >"$work/sigterm2.out" 2>&1 &
pid=$!
for _ in $(seq 1 600); do
  read -r n _ < <(count_tasks "$db")
  [[ $n -ge 24 ]] && break
  sleep 0.1
done
sleep 1 # let a (wrong) second effect show up before counting
kill -TERM "$pid"
wait "$pid" || fail "the second worker exited with an error after SIGTERM"
second=$(applied_in "$work/sigterm2.out")
read -r rows distinct < <(count_tasks "$db")
[[ $rows == 24 && $distinct == 24 ]] || fail "SIGTERM mid-batch: $rows tasks for $distinct messages, expected 24 and 24"
[[ $((first + second)) == 24 ]] || fail "SIGTERM mid-batch: applied $first + $second, expected 24 in all"
echo "examples-smoke: sqs SIGTERM mid-batch ok: first worker applied $first, second $second, 24 tasks" >&2

# The worker hosted in a web service (examples/hosted-service, axum): one pool, one shutdown. 24 events; the
# handler takes 300 ms; SIGTERM once the application's own route (GET /tasks, through the shared pool) shows a
# first task, i.e. in the middle of a batch. The service must drain the worker (commit, then delete), close its
# server after that, exit 0; a second run finishes the queue. Nothing lost, nothing applied twice: 24 tasks, the
# two reports' `applied` add up to 24. PostgreSQL: a database of its own, dropped afterwards.
: "${TXINBOX_TEST_PG_URL:?the hosted service needs PostgreSQL (TXINBOX_TEST_PG_URL)}"
free_port() { python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])'; }
hosted_db="hosted_smoke_$$"
psql "$TXINBOX_TEST_PG_URL" -qtAc "CREATE DATABASE $hosted_db" >/dev/null || fail "cannot create database $hosted_db"
hosted_pg="${TXINBOX_TEST_PG_URL%/*}/$hosted_db"
q="crm-hosted-$$"
"$bin/sqs-producer" --queue-name "$q" --create --opportunity op_0 --meeting m_0 >/dev/null 2>&1
for i in $(seq 1 23); do
  "$bin/sqs-producer" --queue-name "$q" --opportunity "op_$i" --meeting "m_$i" >/dev/null 2>&1
done
printf '[worker]\nconsumer = "crm-hosted"\nconcurrency = 4\n\n[sqs]\nqueue_url = "%s"\nwait_time_seconds = 1\nvisibility_timeout_seconds = 6\n' \
  "$TXINBOX_SQS_ENDPOINT/123456789012/$q.fifo" >"$work/hosted.toml"
hosted_tasks() {
  curl -sf "http://$1/tasks" | python3 -c 'import json,sys; t=json.load(sys.stdin); print(len(t), len({x["message_id"] for x in t}))'
}
# hosted_run NAME UNTIL: runs the service until GET /tasks shows UNTIL tasks, SIGTERM, prints its `applied`.
hosted_run() {
  local name=$1 until=$2 addr
  addr=127.0.0.1:$(free_port)
  TXINBOX_STORE__URL=$hosted_pg "$bin/hosted-service" --config "$work/hosted.toml" --listen "$addr" \
    --handler-delay-ms 300 >"$work/$name.out" 2>"$work/$name.err" &
  local pid=$! n=0
  for _ in $(seq 1 600); do
    kill -0 "$pid" 2>/dev/null || fail "$name died: $(tail -n 5 "$work/$name.out" "$work/$name.err")"
    read -r n _ < <(hosted_tasks "$addr" 2>/dev/null || echo 0 0)
    [[ $n -ge $until ]] && break
    sleep 0.1
  done
  [[ $n -ge $until ]] || fail "$name: only $n tasks after 60 s"
  kill -TERM "$pid"
  wait "$pid" || fail "$name exited with an error after SIGTERM: $(tail -n 5 "$work/$name.err")"
  grep -q "server closed; closing the pool" "$work/$name.out" || fail "$name: the server did not close after the drain"
  applied_in "$work/$name.out"
}
first=$(hosted_run hosted1 1)
second=$(hosted_run hosted2 24)
rows=$(psql "$hosted_pg" -qtAc "select count(*) || ' ' || count(distinct message_id) from crm_followup_tasks")
psql "$TXINBOX_TEST_PG_URL" -qtAc "DROP DATABASE $hosted_db WITH (FORCE)" >/dev/null || true
[[ $rows == "24 24" ]] || fail "hosted service: $rows (tasks, distinct messages), expected 24 24"
[[ $first -lt 24 ]] || fail "hosted service: the first run applied all 24 before its SIGTERM (not mid-batch)"
[[ $((first + second)) == 24 ]] || fail "hosted service: applied $first + $second, expected 24 in all"
echo "examples-smoke: hosted service SIGTERM mid-batch ok: first run applied $first, second $second, 24 tasks" >&2

# Prometheus scrapes a real worker (scripts/prometheus.sh: a throwaway server with ops/alerts.yml loaded): the
# SQS worker runs with --metrics-addr, the inbox retention every second and an external CRM (so the effect
# series exist); events come in two batches so every counter has a before and an after. Then every query of
# ops/dashboard.json must return data (ops/check_dashboard.py), the series this run produces must be real
# (not a dashboard's `or on() vector(0)`), and no alert may fire on this healthy run.
prom_query() { curl -sfG "$TXINBOX_PROMETHEUS_URL/api/v1/query" --data-urlencode "query=$1"; }
result_count() { python3 -c 'import json,sys; print(len(json.load(sys.stdin)["data"]["result"]))'; }
"$bin/txinbox-crm-api" >"$work/crm.out" 2>"$work/crm.err" &
cleanup_pids+=($!)
for _ in $(seq 1 100); do grep -q TXINBOX_CRM_URL "$work/crm.out" && break; sleep 0.1; done
crm_url=$(sed -n 's/^export TXINBOX_CRM_URL=//p' "$work/crm.out")
[[ -n $crm_url ]] || fail "the CRM API did not start: $(tail -n 5 "$work/crm.err")"
metrics_addr=127.0.0.1:$(free_port)
exports=$(TXINBOX_PROMETHEUS_OWNER_PID=$$ bash scripts/prometheus.sh start "$metrics_addr") || fail "prometheus did not start"
eval "$exports"
prom_dir=$TXINBOX_PROMETHEUS_DIR
q="crm-metrics-$$"
"$bin/sqs-producer" --queue-name "$q" --create --opportunity op_metrics_1 --meeting m_1 >/dev/null 2>&1
RUST_LOG=info "$bin/sqs-crm-worker" --queue-url "$TXINBOX_SQS_ENDPOINT/123456789012/$q.fifo" --store "sqlite:$work/metrics.db" \
  --crm-url "$crm_url" --metrics-addr "$metrics_addr" --purge-interval-secs 1 >"$work/metrics.out" 2>"$work/metrics.err" &
metrics_pid=$!
cleanup_pids+=("$metrics_pid")
# First batch applied and scraped: the target is up and the applied counter is above zero in Prometheus (the
# worker registers its counters at zero when it starts).
scraped=0
for _ in $(seq 1 60); do
  kill -0 "$metrics_pid" 2>/dev/null || fail "the metrics worker died: $(tail -n 5 "$work/metrics.err")"
  if curl -sf "$TXINBOX_PROMETHEUS_URL/api/v1/targets" | grep -q '"health":"up"' &&
    [[ $(prom_query 'txinbox_applied_total{consumer="crm-followup"} > 0' | result_count) -ge 1 ]]; then
    scraped=1
    break
  fi
  sleep 0.5
done
[[ $scraped == 1 ]] || fail "prometheus never scraped the worker's first batch at $metrics_addr: $(curl -s "$TXINBOX_PROMETHEUS_URL/api/v1/targets")"
"$bin/sqs-producer" --queue-name "$q" --opportunity op_metrics_2 --meeting m_2 --times 2 >/dev/null 2>&1
"$bin/sqs-producer" --queue-name "$q" --opportunity op_metrics_2 --meeting m_2 --id "evt-metrics-other-$$" >/dev/null 2>&1
for _ in $(seq 1 60); do
  grep -q 'business duplicate' "$work/metrics.out" "$work/metrics.err" && break
  sleep 0.5
done
grep -q 'business duplicate' "$work/metrics.out" "$work/metrics.err" || fail "the metrics worker did not see the second batch"
python3 ops/check_dashboard.py "$TXINBOX_PROMETHEUS_URL" crm-followup --wait 40 --require \
  txinbox_received_total txinbox_applied_total txinbox_business_duplicates_total \
  txinbox_receive_to_commit_seconds_bucket txinbox_inbox_rows txinbox_retention_purged_total \
  txinbox_effects txinbox_effect_oldest_pending_seconds txinbox_effect_executions_total txinbox_worker_deliveries ||
  fail "a dashboard query has no data (see above)"
firing=$(prom_query 'ALERTS{alertstate="firing"}')
[[ $(result_count <<<"$firing") == 0 ]] || fail "alerts fire on a healthy worker: $firing"
kill -TERM "$metrics_pid"
wait "$metrics_pid" || fail "the metrics worker exited with an error: $(tail -n 5 "$work/metrics.err")"
bash scripts/prometheus.sh stop "$prom_dir"
prom_dir=""
echo "examples-smoke: prometheus scraped sqs-crm-worker; every dashboard query has data, no alert fires" >&2

# Service Bus on the emulator: the resend is dropped by duplicate detection, another id is a business
# duplicate. Then a third event for the same follow-up sits in the poison queue; `txinbox servicebus redrive`
# resubmits it with its MessageId and the inbox refuses the repeated follow-up.
q="crm-smoke-$$"
"$bin/servicebus-producer" --queue "$q" --create-on-emulator --times 2 >&2
"$bin/servicebus-producer" --queue "$q" --id "evt-other-$$" >&2
RUST_LOG=info run_worker servicebus 'business duplicate' 'applied=1 business_duplicate=1' \
  "$bin/servicebus-crm-worker" --queue "$q" --dead-letter-to "$q-poison" --store "sqlite:$work/servicebus.db"
"$bin/servicebus-producer" --queue "$q-poison" --id "evt-poisoned-$$" >&2
# The poisoned event never reached the target queue, so its duplicate-detection window cannot hold it: no
# deferral needed (by default a message younger than the window is deferred, since the broker would drop it).
moved=$("$txinbox" servicebus redrive --queue "$q" --from "$q-poison" --wait-secs 1 --dedup-window-secs 0)
[[ $moved == moved=1\ * ]] || fail "servicebus redrive: $moved"
RUST_LOG=info run_worker servicebus-after-redrive 'business duplicate' 'business_duplicate=1' \
  "$bin/servicebus-crm-worker" --queue "$q" --dead-letter-to "$q-poison" --store "sqlite:$work/servicebus.db"
echo "examples-smoke: ok" >&2
