#!/usr/bin/env bash
# Starts and stops the Service Bus REST emulator (crates/txinbox-sb-emulator) for the txinbox-servicebus tests
# and examples.
#
#   eval "$(bash scripts/sb-emulator.sh start)"   # builds it, starts it on a free loopback port, prints exports;
#                                                 # an emulator it started before that still answers is reused
#   bash scripts/sb-emulator.sh status            # exit 0 when the recorded emulator answers
#   bash scripts/sb-emulator.sh stop              # stops the emulator started by `start`
#
# `start` prints shell `export` lines on stdout and nothing else, so it can be eval'ed:
#
#   TXINBOX_SB_EMULATOR_URL          http://127.0.0.1:PORT (data plane and the /$emulator control API)
#   TXINBOX_SB_NAMESPACE             the namespace the emulator signs for (txinbox-test)
#   TXINBOX_SB_KEY_NAME              the SAS rule name (RootManageSharedAccessKey)
#   TXINBOX_SB_KEY                   a random SAS key made for this run
#   TXINBOX_SB_BEARER_TOKEN          a random bearer token the emulator accepts (Azure AD path)
#   TXINBOX_SB_CONNECTION_STRING     Endpoint=sb://txinbox-test.servicebus.windows.net/;SharedAccessKeyName=...;SharedAccessKey=...
#   SERVICEBUS_CONNECTION_STRING     the same, and SERVICEBUS_ENDPOINT=the URL: what ServiceBusConfig::from_env
#                                    (the examples, `txinbox servicebus ...`) reads
#   TXINBOX_SERVER_REUSED            1 when the emulator was already running (a caller then leaves it running)
#
# The connection string names the public host (the client signs for it); point the client at
# TXINBOX_SB_EMULATOR_URL with ServiceBusConfig::endpoint (the examples' --endpoint). Progress and errors go
# to stderr; it exits non-zero with a message when the emulator cannot be built or does not come up: it never
# skips silently. Set SB_EMULATOR_PORT to choose the port.
set -euo pipefail

root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
name=sb-emulator
# shellcheck source=lib/server.sh
source "$root/scripts/lib/server.sh"
env_file="$state/emulator.env"
out_file="$state/emulator.stdout"
namespace=${SB_EMULATOR_NAMESPACE:-txinbox-test}
key_name=RootManageSharedAccessKey

# The exports hold the SAS key: they go with the emulator (stop, from lib/server.sh, calls this).
on_stop() { rm -f "$env_file"; }

random_text() {
  # $1 bytes of randomness, base64 (a SAS key looks like this).
  head -c "$1" /dev/urandom | base64 | tr -d '\n'
}

target_dir() {
  if [[ -n "${CARGO_TARGET_DIR:-}" ]]; then
    echo "$CARGO_TARGET_DIR"
  else
    cargo metadata --format-version 1 --no-deps --manifest-path "$root/Cargo.toml" 2>/dev/null |
      sed -n 's/.*"target_directory":"\([^"]*\)".*/\1/p'
  fi
}

start() {
  command -v cargo >/dev/null || fail "cargo is not on PATH"
  if running_pid >/dev/null; then
    # A recorded emulator that answers is reused: its exports (the SAS key other shells hold) stay valid.
    local running=""
    running=$(sed -n 's/^export TXINBOX_SB_EMULATOR_URL=//p' "$env_file" 2>/dev/null || true)
    if [[ -n "$running" ]] && curl -fsS --max-time 5 "$running/\$emulator/health" >/dev/null 2>&1; then
      say "reusing the emulator at $running (pid $(running_pid))"
      cat "$env_file"
      echo "export TXINBOX_SERVER_REUSED=1"
      return
    fi
    stop
  fi
  mkdir -p "$state"
  say "building txinbox-sb-emulator"
  (cd "$root" && cargo build --quiet -p txinbox-sb-emulator >&2) || fail "cargo build -p txinbox-sb-emulator failed"
  local dir bin
  dir=$(target_dir)
  [[ -n "$dir" ]] || dir="$root/target"
  bin="$dir/debug/txinbox-sb-emulator"
  [[ -x "$bin" ]] || fail "built, but $bin is missing"

  local key bearer listen
  key=$(random_text 32)
  bearer=$(random_text 24)
  listen="127.0.0.1:${SB_EMULATOR_PORT:-0}"
  : >"$out_file"
  # Secrets go through the environment, not argv (visible in ps).
  TXINBOX_SB_EMULATOR_SAS_KEY="$key" TXINBOX_SB_EMULATOR_ACCEPT_BEARER="$bearer" RUST_LOG="${RUST_LOG:-warn}" \
    nohup "$bin" --listen "$listen" --namespace "$namespace" --sas-key-name "$key_name" \
    >"$out_file" 2>"$log_file" </dev/null &
  local pid=$!
  echo "$pid" >"$pid_file"

  local url=""
  for _ in $(seq 1 300); do
    if ! kill -0 "$pid" 2>/dev/null; then
      tail -n 20 "$log_file" >&2 || true
      rm -f "$pid_file"
      fail "the emulator exited during start-up (log above, full log in $log_file)"
    fi
    url=$(sed -n 's/^listening on \(http:\/\/[0-9.:]*\).*/\1/p' "$out_file" | head -n 1)
    [[ -n "$url" ]] && break
    sleep 0.1
  done
  if [[ -z "$url" ]]; then
    stop
    fail "the emulator printed no 'listening on' line within 30 s (log: $log_file)"
  fi
  if command -v curl >/dev/null; then
    curl -fsS --max-time 5 "$url/\$emulator/health" >/dev/null || {
      stop
      fail "the emulator at $url does not answer /\$emulator/health"
    }
  fi
  local cs="Endpoint=sb://$namespace.servicebus.windows.net/;SharedAccessKeyName=$key_name;SharedAccessKey=$key"
  {
    echo "export TXINBOX_SB_EMULATOR_URL=$url"
    echo "export TXINBOX_SB_NAMESPACE=$namespace"
    echo "export TXINBOX_SB_KEY_NAME=$key_name"
    printf 'export TXINBOX_SB_KEY=%q\n' "$key"
    printf 'export TXINBOX_SB_BEARER_TOKEN=%q\n' "$bearer"
    printf 'export TXINBOX_SB_CONNECTION_STRING=%q\n' "$cs"
    # What ServiceBusConfig::from_env (the examples, `txinbox servicebus`) reads.
    printf 'export SERVICEBUS_CONNECTION_STRING=%q\n' "$cs"
    echo "export SERVICEBUS_ENDPOINT=$url"
  } >"$env_file"
  chmod 600 "$env_file"
  say "emulator running at $url (pid $pid, log $log_file)"
  cat "$env_file"
  echo "export TXINBOX_SERVER_REUSED=0"
}

status() {
  local pid
  pid=$(running_pid) || fail "no emulator recorded in $pid_file"
  local url
  url=$(sed -n 's/^export TXINBOX_SB_EMULATOR_URL=//p' "$env_file" 2>/dev/null)
  [[ -n "$url" ]] || fail "no URL recorded in $env_file"
  if command -v curl >/dev/null; then
    curl -fsS --max-time 5 "$url/\$emulator/health" >/dev/null || fail "emulator pid $pid at $url does not answer"
  fi
  say "emulator pid $pid at $url is up"
}

case "${1:-}" in
start) start ;;
stop) stop ;;
status) status ;;
*)
  echo "usage: bash scripts/sb-emulator.sh start|stop|status" >&2
  exit 2
  ;;
esac
