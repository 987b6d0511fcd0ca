#!/usr/bin/env bash
# A real Prometheus for the ops tests: the rules in ops/ checked and unit-tested with promtool, and a throwaway
# server that scrapes one target.
#
#   bash scripts/prometheus.sh install              # apt-get installs Debian's `prometheus` if missing
#   bash scripts/prometheus.sh rules                # promtool check rules ops/alerts.yml + test rules ops/alerts_test.yml
#   eval "$(bash scripts/prometheus.sh start 127.0.0.1:9464)"   # a server scraping that target every second
#   bash scripts/prometheus.sh query 'up'           # GET /api/v1/query on the started server (prints the JSON)
#   bash scripts/prometheus.sh stop                 # stops it (uses TXINBOX_PROMETHEUS_DIR) and removes its data
#
# `start` listens on a free port of 127.0.0.1, keeps its config and TSDB in a temporary directory, loads
# ops/alerts.yml (so the rules also run against real series), and prints the exports:
#   TXINBOX_PROMETHEUS_URL  http://127.0.0.1:PORT
#   TXINBOX_PROMETHEUS_DIR  the temporary directory (config, data, log, pid)
# The server stops when `stop` is called, or by itself once the process that started it (the caller of this
# script) is gone, or after an hour at most. Installing the Debian package does not leave a server of its own
# running: if the package's service was started (a systemd machine) it is stopped and disabled, since the
# tests never use it and it would hold :9090.
#
# Any failure is loud: a message on stderr and a non-zero exit. Nothing is skipped.
set -euo pipefail
root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)

say() { echo "prometheus.sh: $*" >&2; }
die() {
  echo "prometheus.sh: FAILED: $*" >&2
  exit 1
}

install() {
  if command -v prometheus >/dev/null && command -v promtool >/dev/null; then
    return 0
  fi
  command -v apt-get >/dev/null || die "prometheus/promtool missing and no apt-get: install Prometheus 2.x (prometheus and promtool on PATH)"
  local sudo=""
  [[ $(id -u) == 0 ]] || sudo="sudo"
  say "installing Debian's prometheus package (first use)"
  $sudo apt-get update >&2 || die "apt-get update failed"
  DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y --no-install-recommends prometheus >&2 ||
    die "apt-get install prometheus failed"
  # The package enables a service on :9090 (it only starts where systemd runs): the tests use their own server.
  if command -v systemctl >/dev/null && systemctl is-active --quiet prometheus 2>/dev/null; then
    $sudo systemctl disable --now prometheus >&2 || die "could not stop the package's prometheus service"
  fi
  command -v prometheus >/dev/null && command -v promtool >/dev/null ||
    die "the prometheus package is installed but prometheus/promtool are not on PATH"
}

rules() {
  install
  cd "$root/ops"
  promtool check rules alerts.yml >&2 || die "promtool check rules ops/alerts.yml"
  promtool test rules alerts_test.yml >&2 || die "promtool test rules ops/alerts_test.yml"
}

free_port() {
  python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])'
}

start() {
  local target=${1:?usage: prometheus.sh start HOST:PORT}
  install
  local dir port pid
  dir=$(mktemp -d "${TMPDIR:-/tmp}/txinbox-prometheus.XXXXXX")
  port=$(free_port)
  cp "$root/ops/alerts.yml" "$dir/alerts.yml"
  cat >"$dir/prometheus.yml" <<EOF
global:
  scrape_interval: 1s
  evaluation_interval: 1s
rule_files:
  - alerts.yml
scrape_configs:
  - job_name: txinbox
    scrape_interval: 1s
    scrape_timeout: 1s
    static_configs:
      - targets: ["$target"]
EOF
  promtool check config "$dir/prometheus.yml" >&2 || die "the generated config does not check"
  # The caller of this script (or TXINBOX_PROMETHEUS_OWNER_PID): the server must not outlive it.
  local caller=${TXINBOX_PROMETHEUS_OWNER_PID:-$PPID}
  setsid prometheus --config.file="$dir/prometheus.yml" --storage.tsdb.path="$dir/data" \
    --web.listen-address="127.0.0.1:$port" >"$dir/log" 2>&1 </dev/null &
  pid=$!
  echo "$pid" >"$dir/pid"
  # Watchdog, bounded (an hour at most): stops the server once the caller is gone.
  (
    for _ in $(seq 1 3600); do
      kill -0 "$pid" 2>/dev/null || exit 0
      kill -0 "$caller" 2>/dev/null || break
      sleep 1
    done
    kill "$pid" 2>/dev/null || true
  ) >/dev/null 2>&1 </dev/null &
  disown -a
  for _ in $(seq 1 100); do
    if curl -sf "http://127.0.0.1:$port/-/ready" >/dev/null 2>&1; then
      say "prometheus (pid $pid) on 127.0.0.1:$port scraping $target (dir $dir)"
      echo "export TXINBOX_PROMETHEUS_URL=http://127.0.0.1:$port TXINBOX_PROMETHEUS_DIR=$dir"
      return 0
    fi
    kill -0 "$pid" 2>/dev/null || break
    sleep 0.2
  done
  tail -n 20 "$dir/log" >&2 || true
  kill "$pid" 2>/dev/null || true
  die "prometheus did not become ready on 127.0.0.1:$port"
}

stop() {
  local dir=${1:-${TXINBOX_PROMETHEUS_DIR:-}}
  [[ -n $dir && -d $dir ]] || return 0
  if [[ -f $dir/pid ]]; then
    local pid
    pid=$(cat "$dir/pid")
    if kill "$pid" 2>/dev/null; then
      for _ in $(seq 1 50); do
        kill -0 "$pid" 2>/dev/null || break
        sleep 0.1
      done
      kill -9 "$pid" 2>/dev/null || true
    fi
  fi
  rm -rf "$dir"
}

query() {
  : "${TXINBOX_PROMETHEUS_URL:?run prometheus.sh start first}"
  curl -sfG "$TXINBOX_PROMETHEUS_URL/api/v1/query" --data-urlencode "query=$1"
}

case ${1:-} in
  install) install ;;
  rules) rules ;;
  start) start "${2:-}" ;;
  stop) stop "${2:-}" ;;
  query) query "${2:?usage: prometheus.sh query PROMQL}" ;;
  *) die "usage: prometheus.sh install|rules|start HOST:PORT|stop [DIR]|query PROMQL" ;;
esac
