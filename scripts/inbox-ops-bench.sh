#!/usr/bin/env bash
# The operator commands (`txinbox inbox stats|show|rejections`) on a large inbox: 1,000,000 markers, ~10,000
# rejections and ~100,000 effects loaded into a fresh PostgreSQL schema with INSERT ... SELECT generate_series,
# then each command timed as the real binary runs it, and the plan of each of its queries printed with
# EXPLAIN (ANALYZE, BUFFERS). A benchmark, not a test: the target is each command under one second.
#
#   bash scripts/inbox-ops-bench.sh [postgres-url]
#
# The binary is $TXINBOX_BIN, else target/release/txinbox, else target/debug/txinbox (build it first:
# cargo build -p txinbox-cli). The commands are timed twice: right after the load and ANALYZE (the visibility
# map is not set yet, so index-only scans still visit the heap), and after VACUUM (what autovacuum leaves on a
# live table). The schema is dropped at the end.
set -euo pipefail
root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
url=${1:-postgres://postgres@127.0.0.1:5432/test}
bin=${TXINBOX_BIN:-}
if [[ -z $bin ]]; then
  if [[ -x $root/target/release/txinbox ]]; then bin=$root/target/release/txinbox; else bin=$root/target/debug/txinbox; fi
fi
[[ -x $bin ]] || { echo "no txinbox binary at $bin: cargo build -p txinbox-cli" >&2; exit 2; }
schema="inbox_ops_bench_$$"
sep='?'; [[ $url == *'?'* ]] && sep='&'
store="${url}${sep}options=-csearch_path%3D${schema}"
psql_s() { PGOPTIONS="-c search_path=$schema" psql -X -q -v ON_ERROR_STOP=1 "$url" "$@"; }
trap 'psql -X -q "$url" -c "DROP SCHEMA IF EXISTS $schema CASCADE" >/dev/null 2>&1 || true' EXIT

echo "== schema $schema (txinbox schema --backend postgres: every migration, operator indexes included)"
psql -X -q -v ON_ERROR_STOP=1 "$url" -c "CREATE SCHEMA $schema"
"$bin" schema --backend postgres | psql_s >/dev/null

echo "== load (consumers: orders 90 %, billing 9 %, crm-followup 1 %; two sources; 7 days of markers)"
load_start=$(date +%s.%N)
psql_s <<'SQL'
-- 1,000,000 markers in time order (as the inbox writes them), over the last 7 days.
INSERT INTO txinbox_inbox (consumer_name, source, message_id, event_type, business_key, payload_hash, contract_version, tenant_id, received_at, processed_at, result_reference, retention_until, id_origin, delivery_count)
SELECT CASE WHEN i % 100 < 90 THEN 'orders' WHEN i % 100 < 99 THEN 'billing' ELSE 'crm-followup' END,
       'urn:bench:' || (i % 2), 'evt-' || i, 'bench.event', 'bk-' || i, md5(i::text), '1', NULL,
       t - interval '20 ms', t, 'ref-' || i, t + interval '7 days', 'cloudevents_attributes', 1 + (i % 3 = 0)::int
FROM generate_series(1, 1000000) i, LATERAL (SELECT now() - interval '7 days' + i * interval '604 ms') x(t);
-- 10,000 rejections: one in every 100 messages, half payload collisions, half business duplicates.
INSERT INTO txinbox_rejections (consumer_name, source, message_id, kind, business_key, payload_hash, conflicts_with, detail, recorded_at)
SELECT CASE WHEN m % 100 < 90 THEN 'orders' WHEN m % 100 < 99 THEN 'billing' ELSE 'crm-followup' END,
       'urn:bench:' || (m % 2),
       CASE WHEN j % 2 = 0 THEN 'evt-' || m ELSE 'evt-republished-' || m END,
       CASE WHEN j % 2 = 0 THEN 'payload_collision' ELSE 'business_duplicate' END,
       'bk-' || m, md5('other' || m),
       CASE WHEN j % 2 = 0 THEN md5(m::text) ELSE 'evt-' || m END,
       'bench', now() - interval '7 days' + m * interval '604 ms' + interval '1 s'
FROM generate_series(1, 10000) j, LATERAL (SELECT j * 100 - 100 + (j * 37) % 100) x(m);
-- 100,000 effects: one in every 10 messages; done, but 1 % failed and the newest 2 % pending (the lag).
INSERT INTO txinbox_effects (consumer_name, message_id, idempotency_key, name, destination, payload, metadata, external_ref, group_key, state, attempts, reconciliations, next_attempt_at, claimed_by, claim_until, result_reference, last_error, created_at, updated_at, finished_at)
SELECT CASE WHEN m % 100 < 90 THEN 'orders' WHEN m % 100 < 99 THEN 'billing' ELSE 'crm-followup' END,
       'evt-' || m, 'key-' || m, 'crm.create_task', 'crm', '\x7b7d'::bytea, '{}', 'key-' || m, NULL,
       st, CASE WHEN st = 'pending' THEN 0 ELSE 1 END, 0, t, NULL, NULL,
       CASE WHEN st = 'done' THEN 'task-' || m END, CASE WHEN st = 'failed' THEN 'HTTP 422' END,
       t, t, CASE WHEN st <> 'pending' THEN t + interval '1 s' END
FROM generate_series(1, 100000) j,
     LATERAL (SELECT j * 10 - 10 + j % 10, CASE WHEN j > 98000 THEN 'pending' WHEN j % 100 = 99 THEN 'failed' ELSE 'done' END) x(m, st),
     LATERAL (SELECT now() - interval '7 days' + m * interval '604 ms') y(t);
ANALYZE txinbox_inbox; ANALYZE txinbox_rejections; ANALYZE txinbox_effects;
SQL
printf 'loaded in %.1f s: ' "$(echo "$(date +%s.%N) - $load_start" | bc)"
psql_s -At -c "SELECT (SELECT count(*) FROM txinbox_inbox) || ' markers, ' || (SELECT count(*) FROM txinbox_rejections) || ' rejections, ' || (SELECT count(*) FROM txinbox_effects) || ' effects; inbox ' || pg_size_pretty(pg_total_relation_size('txinbox_inbox'))"

since=$(psql_s -At -c "SELECT to_char((now() - interval '1 day') AT TIME ZONE 'UTC', 'YYYY-MM-DD\"T\"HH24:MI:SS\"Z\"')")
commands=(
  "stats"
  "stats --json"
  "stats --consumer orders"
  "show --consumer orders --message-id evt-500000"
  "show --consumer orders --message-id evt-500000 --source urn:bench:0"
  "show --consumer orders --message-id evt-500174"
  "show --consumer orders --message-id evt-republished-500037"
  "show --consumer orders --message-id evt-980023"
  "show --consumer orders --message-id evt-500000 --json"
  "show --consumer orders --message-id evt-missing"
  "rejections"
  "rejections --consumer orders --kind payload_collision --since $since --limit 50"
  "rejections --kind business_duplicate --limit 200"
)

time_all() {
  echo "== timings ($1): wall seconds of the whole process (connect, queries, output)"
  local c start end rc
  for c in "${commands[@]}"; do
    start=$(date +%s.%N)
    # shellcheck disable=SC2086
    "$bin" inbox $c --store "$store" >/dev/null 2>&1 && rc=0 || rc=$?
    end=$(date +%s.%N)
    printf '%6.3f s  exit %d  txinbox inbox %s\n' "$(echo "$end - $start" | bc)" "$rc" "$c"
  done
}

time_all "after load + ANALYZE"
psql_s -c "VACUUM (ANALYZE) txinbox_inbox" -c "VACUUM (ANALYZE) txinbox_rejections" -c "VACUUM (ANALYZE) txinbox_effects"
time_all "after VACUUM"

echo
echo "== sample output"
for c in "stats" "show --consumer orders --message-id evt-500174" "show --consumer orders --message-id evt-republished-500037" "show --consumer orders --message-id evt-980023" "rejections --limit 5"; do
  echo "\$ txinbox inbox $c --store postgres://..."
  # shellcheck disable=SC2086
  "$bin" inbox $c --store "$store" || true
  echo
done

# The queries of crates/txinbox-store/src/ops/ with the parameters of the commands above.
hour_ago="now() - interval '1 hour'"
skip='WITH RECURSIVE c(name) AS (SELECT min(consumer_name) FROM %s UNION ALL SELECT (SELECT min(consumer_name) FROM %s WHERE consumer_name > c.name) FROM c WHERE c.name IS NOT NULL) SELECT name FROM c WHERE name IS NOT NULL LIMIT 10000'
marker_cols='i.consumer_name, i.source, i.message_id, i.event_type, i.business_key, i.payload_hash, i.contract_version, i.tenant_id, i.received_at, i.processed_at, i.result_reference, i.retention_until, i.id_origin, i.delivery_count'
rej_cols='id, consumer_name, source, message_id, kind, business_key, payload_hash, conflicts_with, detail, recorded_at'
fx_cols='id, idempotency_key, name, destination, external_ref, group_key, state, attempts, reconciliations, next_attempt_at, claimed_by, claim_until, result_reference, last_error, created_at, updated_at, finished_at'
queries=(
  "stats: consumers of txinbox_inbox|$(printf "$skip" txinbox_inbox txinbox_inbox)"
  "stats: consumers of txinbox_rejections|$(printf "$skip" txinbox_rejections txinbox_rejections)"
  "stats: consumers of txinbox_effects|$(printf "$skip" txinbox_effects txinbox_effects)"
  "stats: inbox of the largest consumer (900,000 rows)|SELECT count(*), min(processed_at), max(processed_at), count(CASE WHEN processed_at >= $hour_ago THEN 1 END) FROM txinbox_inbox WHERE consumer_name = 'orders'"
  "stats: rejections by kind|SELECT kind, count(*), max(recorded_at) FROM txinbox_rejections WHERE consumer_name = 'orders' GROUP BY kind"
  "stats: effects by state (orders: 90 % of the table)|SELECT state, count(*), min(created_at) FROM txinbox_effects WHERE consumer_name = 'orders' GROUP BY state"
  "stats: effects by state (billing: 10 % of the table)|SELECT state, count(*), min(created_at) FROM txinbox_effects WHERE consumer_name = 'billing' GROUP BY state"
  "stats: rejections by kind (billing)|SELECT kind, count(*), max(recorded_at) FROM txinbox_rejections WHERE consumer_name = 'billing' GROUP BY kind"
  "show: marker, any source (skip scan over the sources)|WITH RECURSIVE s(source) AS (SELECT min(source) FROM txinbox_inbox WHERE consumer_name = 'orders' UNION ALL SELECT (SELECT min(source) FROM txinbox_inbox WHERE consumer_name = 'orders' AND source > s.source) FROM s WHERE s.source IS NOT NULL) SELECT $marker_cols FROM s JOIN txinbox_inbox i ON i.consumer_name = 'orders' AND i.source = s.source AND i.message_id = 'evt-500000' ORDER BY i.source"
  "show: marker with its source|SELECT $marker_cols FROM txinbox_inbox i WHERE i.consumer_name = 'orders' AND i.message_id = 'evt-500000' AND i.source = 'urn:bench:0'"
  "show: rejections of the message|SELECT $rej_cols FROM txinbox_rejections WHERE consumer_name = 'orders' AND message_id = 'evt-500174'"
  "show: effects of the message|SELECT $fx_cols FROM txinbox_effects WHERE consumer_name = 'orders' AND message_id = 'evt-980023'"
  "rejections: newest 50|SELECT $rej_cols FROM txinbox_rejections ORDER BY recorded_at DESC, id DESC LIMIT 50"
  "rejections: consumer, kind, since|SELECT $rej_cols FROM txinbox_rejections WHERE consumer_name = 'orders' AND kind = 'payload_collision' AND recorded_at >= '$since' ORDER BY recorded_at DESC, id DESC LIMIT 50"
  "rejections: kind, all consumers|SELECT $rej_cols FROM txinbox_rejections WHERE kind = 'business_duplicate' ORDER BY recorded_at DESC, id DESC LIMIT 200"
)
echo "== plans (after VACUUM)"
for q in "${queries[@]}"; do
  echo
  echo "-- ${q%%|*}"
  psql_s -c "EXPLAIN (ANALYZE, BUFFERS, COSTS OFF) ${q#*|}" | sed -e '/^ *QUERY PLAN/d' -e '/^---/d' -e '/^([0-9]* rows*)/d' -e '/^$/d'
done
