#!/usr/bin/env bash
# What dropping a large table costs the commits of other sessions on a PostgreSQL server's filesystem: the
# cost that retention by partition pays once per dropped partition. A benchmark, not a test.
#
#   bash scripts/drop-cost.sh [postgres-url] [rows]
#   EVICT=1 bash scripts/drop-cost.sh ...   # evict the table's pages from the OS page cache before the drop
#
# It creates a table of `rows` rows (default 9,000,000: about 1 GB), checkpoints, starts `pgbench` with 8
# clients committing one-row inserts for 8 s, drops the table 4 s in, and prints the commits of every 100 ms
# slot, the slots the drop overlapped marked `DROP`, then one summary line: the drop's duration, its slots,
# the mean of the others, and the commits lost (the others' mean times the drop's slots, less what they
# committed) in slots of 100 ms, and the mean of the slots before the drop and after it (a cost that outlasts
# the drop lowers the second). When the script runs on the server's host as a user who can read the data
# directory, it also prints how much of the table the OS page cache held at the drop (util-linux `fincore`);
# with EVICT=1 it first evicts those pages (posix_fadvise DONTNEED, after a sync), so that the drop frees
# blocks that are on disk only, as a partition that has left the cache would. The files a DROP releases are freed by the filesystem at the drop's commit;
# on ext4 mounted with online `discard` that release also discards every freed block, and other sessions'
# WAL flushes wait on it (docs/partitions.md, "What a drop costs").
#
# It works in tables `drop_cost_big` and `drop_cost_commits` of the URL's database, dropped at the end.
set -euo pipefail
url=${1:-postgres://postgres@127.0.0.1:5432/test}
rows=${2:-9000000}
name=drop-cost tables="drop_cost_big, drop_cost_commits"
# shellcheck source=lib/pgbench.sh
source "$(dirname "$0")/lib/pgbench.sh"

q "CREATE TABLE drop_cost_commits (id bigserial PRIMARY KEY, v text)"
q "CREATE TABLE drop_cost_big AS SELECT g AS id, repeat('x', 80) AS v FROM generate_series(1, $rows) g"
size=$(q "SELECT pg_size_pretty(pg_total_relation_size('drop_cost_big'))")
q "CHECKPOINT"
sync
files=()
datadir=$(q "SHOW data_directory" 2>/dev/null || true)
relpath=$(q "SELECT pg_relation_filepath('drop_cost_big')")
if [[ -n $datadir && -r $datadir/$relpath ]]; then
  files=("$datadir/$relpath" "$datadir/$relpath".*)
  [[ -e ${files[1]} ]] || files=("${files[0]}")
fi
cached() {
  ((${#files[@]})) || { echo unknown; return; }
  fincore -b -n -o RES "${files[@]}" | awk '{ s += $1 } END { printf "%.0f MB", s / 1048576 }'
}
if [[ ${EVICT:-0} == 1 ]]; then
  ((${#files[@]})) || { echo "drop-cost.sh: EVICT=1 needs the data directory readable on this host" >&2; exit 1; }
  python3 -c 'import os, sys
for f in sys.argv[1:]:
    fd = os.open(f, os.O_RDONLY); os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED); os.close(fd)' "${files[@]}"
fi
sleep 2
in_cache=$(cached)
echo "INSERT INTO drop_cost_commits (v) VALUES ('x');" >"$work/ins.sql"
(cd "$work" && pgbench -n -c 8 -j 2 -T 8 -l -f ins.sql "$url" >pgbench.out 2>&1) &
bench=$!
sleep 4
t0=$(date +%s.%N)
q "DROP TABLE drop_cost_big"
t1=$(date +%s.%N)
wait "$bench" || { cat "$work/pgbench.out" >&2; exit 1; }

# pgbench's log: client, transaction, latency, script, epoch seconds, microseconds. The first and last slots
# are partial and left out.
cat "$work"/pgbench_log.* | awk '{ c[int(($5 + $6 / 1e6) * 10)]++ } END { for (s in c) print s, c[s] }' |
  sort -n | sed '1d;$d' | awk -v t0="$t0" -v t1="$t1" -v size="$size" -v cache="$in_cache" '
  function slot(s, n, drop) {
    drop = (s / 10 + 0.1 > t0 && s / 10 <= t1)
    printf "%d.%d %d%s\n", s / 10, s % 10, n, drop ? " DROP" : ""
    if (drop) { d += n; nd++; ds = ds " " n } else { o += n; no++ }
    if (!drop && s / 10 + 0.1 <= t0) { b += n; nb++ }
    if (!drop && s / 10 > t1) { a += n; na++ }
  }
  {
    # A slot in which nothing committed has no line: it counts, as 0.
    for (s = prev + 1; prev && s < $1; s++) slot(s, 0)
    slot($1, $2)
    prev = $1
  }
  END {
    mean = o / no
    printf "drop of %s (%s of it in the page cache) took %.2f s; its slots:%s; other slots %.0f on average;",
      size, cache, t1 - t0, ds, mean
    printf " lost %.1f slots of commits; before the drop %.0f, after it %.0f\n", (mean * nd - d) / mean, b / nb, a / na
  }'
