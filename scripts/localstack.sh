#!/usr/bin/env bash
# Starts and stops LocalStack's SQS on the host (no Docker), for the SQS adapter's end-to-end benchmark: moto
# answers one request at a time and tops out near 75 messages per second through the worker, LocalStack's own
# SQS provider keeps up with far more (docs/results.md, "Through the SQS adapter").
#
#   eval "$(bash scripts/localstack.sh start)"   # installs LocalStack if needed, starts it, exports TXINBOX_SQS_ENDPOINT
#   bash scripts/localstack.sh status            # exit 0 when the recorded server answers
#   bash scripts/localstack.sh stop              # stops the server started by `start`
#
# LocalStack's command (PyPI `localstack`) runs LocalStack in a Docker container; its runtime is the PyPI package
# `localstack-core`, which runs on the host with `python -m localstack.runtime.main`. That needs Python 3.12 or
# later (its code uses PEP 695 generics): the script takes $LOCALSTACK_PYTHON, else the first python3.13 or
# python3.12 it finds (pyenv's included). Three of its dependencies are pinned below the versions pip would pick:
# cbor2 (6.x moved the `cbor2._decoder` module LocalStack imports) and pyOpenSSL (newer ones dropped
# `X509.add_extensions`, which LocalStack's certificate for its HTTPS side calls). Only SQS is started
# (`SERVICES=sqs`), on 127.0.0.1 only, with hypercorn; the port answers plain HTTP as well as HTTPS.
# `start` prints shell `export` lines on stdout (and nothing else); it exits non-zero with a message when
# LocalStack cannot be installed or does not answer. Not part of the test command: the tests use moto.
set -euo pipefail

LOCALSTACK_VERSION=${LOCALSTACK_VERSION:-2026.3.0}

root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
venv="$root/.build/venv-localstack"
name=localstack
# shellcheck source=lib/server.sh
source "$root/scripts/lib/server.sh"

find_python() {
  if [[ -n ${LOCALSTACK_PYTHON:-} ]]; then
    echo "$LOCALSTACK_PYTHON"
    return 0
  fi
  local p
  for p in python3.13 python3.12 "$HOME"/.pyenv/versions/3.13*/bin/python3 "$HOME"/.pyenv/versions/3.12*/bin/python3; do
    if command -v "$p" >/dev/null 2>&1 && "$p" -c 'import sys; sys.exit(sys.version_info < (3, 12))' 2>/dev/null; then
      command -v "$p"
      return 0
    fi
  done
  return 1
}

installed_version() { pip_version localstack-core; }

install() {
  if [[ -x "$venv/bin/python" && "$(installed_version || true)" == "$LOCALSTACK_VERSION" ]] &&
    "$venv/bin/python" -c 'import localstack.aws.components' 2>/dev/null; then
    return 0
  fi
  local python
  python=$(find_python) || fail "LocalStack needs Python 3.12 or later: none found (set LOCALSTACK_PYTHON)"
  say "installing localstack-core[runtime]==$LOCALSTACK_VERSION with $python into .build/venv-localstack (first use)"
  mkdir -p "$root/.build"
  if [[ ! -x "$venv/bin/python" ]]; then
    "$python" -m venv "$venv" >&2 || fail "cannot create a virtual environment with $python"
  fi
  "$venv/bin/python" -m pip install --quiet --disable-pip-version-check \
    "localstack-core[runtime]==$LOCALSTACK_VERSION" "cbor2==5.6.5" "pyOpenSSL==24.3.0" >&2 ||
    fail "pip could not install localstack-core[runtime]==$LOCALSTACK_VERSION"
  "$venv/bin/python" -c 'import localstack.aws.components' >&2 ||
    fail "LocalStack installed but its runtime does not import (see above)"
}

answers() {
  "$venv/bin/python" - "$1" <<'PY' 2>/dev/null
import json, sys, urllib.request
health = json.load(urllib.request.urlopen(f"http://127.0.0.1:{sys.argv[1]}/_localstack/health", timeout=2))
sys.exit(0 if health["services"].get("sqs") in ("available", "running") else 1)
PY
}

print_exports() {
  echo "export TXINBOX_SQS_ENDPOINT=http://127.0.0.1:$1"
}

start() {
  install
  mkdir -p "$state/volume"
  already_running && return 0
  local port=${LOCALSTACK_PORT:-$(free_port)}
  # Dummy credentials only: nothing real must reach it. No usage events, no update checks, no DNS server.
  AWS_ACCESS_KEY_ID=test AWS_SECRET_ACCESS_KEY=test AWS_DEFAULT_REGION=us-east-1 \
    GATEWAY_LISTEN="127.0.0.1:$port" SERVICES=sqs SQS_ENDPOINT_STRATEGY=path GATEWAY_SERVER=hypercorn DNS_ADDRESS=0 \
    DISABLE_EVENTS=1 SKIP_SSL_CERT_DOWNLOAD=1 LOCALSTACK_VOLUME_DIR="$state/volume" \
    nohup "$venv/bin/python" -m localstack.runtime.main >"$log_file" 2>&1 &
  local pid=$!
  await_started "$pid" "$port" LocalStack 60 "LocalStack $LOCALSTACK_VERSION (SQS) listening on 127.0.0.1:$port (pid $pid, log $log_file)"
}

server_main "$@"
