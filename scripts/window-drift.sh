#!/usr/bin/env bash
# How far apart a PostgreSQL server's commit rate drifts from one window to the next when nothing changes: the
# floor under any "during / without" figure read between windows (`txinbox-bench --purge-impact`). A
# benchmark, not a test; it involves no txinbox code.
#
#   bash scripts/window-drift.sh [postgres-url] [seconds] [window-seconds]
#
# `pgbench` commits one-row inserts from 8 clients for `seconds` (default 300), its rate printed every second.
# The run is cut in windows of `window-seconds` (default 10) and read as the benchmark reads a drop: each run
# of three windows A B C gives `B / mean(A, C)`, whose spread, with nothing dropped, is the drift the
# benchmark's `during/without` cannot tell from a cost. Then alternations: groups of 2k+1 windows read as
# the mean of the odd ones against the mean of the even ones (k = 6 and 12), what an interleaved design
# would read with nothing dropped. Last, one line: the spread of the triples.
#
# It works in table `window_drift` of the URL's database, dropped at the end.
set -euo pipefail
url=${1:-postgres://postgres@127.0.0.1:5432/test}
secs=${2:-300}
win=${3:-10}
[[ $secs =~ ^[0-9]+$ && $win =~ ^[0-9]+$ ]] && ((win >= 1 && secs >= 3 * win)) \
  || { echo "window-drift.sh: seconds and window-seconds must be whole numbers, seconds at least three windows" >&2; exit 2; }
name=window-drift tables=window_drift
# shellcheck source=lib/pgbench.sh
source "$(dirname "$0")/lib/pgbench.sh"

q "CREATE TABLE window_drift (id bigserial PRIMARY KEY, v text)"
q "CHECKPOINT"
echo "INSERT INTO window_drift (v) VALUES ('x');" >"$work/ins.sql"
pgbench -n -c 8 -j 2 -T "$secs" -P 1 -f "$work/ins.sql" "$url" >"$work/pgbench.out" 2>&1 \
  || { echo "window-drift.sh: pgbench failed:" >&2; cat "$work/pgbench.out" >&2; exit 1; }

awk -v W="$win" '
  $1 == "progress:" { r[n++] = $4 }
  END {
    for (i = 0; i + W <= n; i += W) { s = 0; for (j = i; j < i + W; j++) s += r[j]; w[m++] = s / W }
    printf "window_drift seconds=%d windows=%d window_seconds=%d\n", n, m, W
    if (m < 3) { print "window-drift.sh: pgbench reported fewer than three whole windows" > "/dev/stderr"; exit 1 }
    line = "triples B/mean(A,C):"; lo = 9; hi = 0
    for (i = 0; i + 2 < m; i += 3) {
      x = w[i + 1] / ((w[i] + w[i + 2]) / 2); line = line sprintf(" %.3f", x)
      if (x < lo) lo = x; if (x > hi) hi = x; t++
    }
    print line
    for (k = 6; k <= 12; k += 6) {
      line = sprintf("alternating %d pairs:", k)
      for (s = 0; s + 2 * k < m; s += 2 * k + 1) {
        d = 0; e = 0
        for (j = 0; j <= 2 * k; j++) { if (j % 2) d += w[s + j]; else e += w[s + j] }
        line = line sprintf(" %.3f", (d / k) / (e / (k + 1)))
      }
      print line
    }
    printf "window_drift triples=%d min=%.3f max=%.3f\n", t, lo, hi
  }' "$work/pgbench.out"
