#!/usr/bin/env bash
# The code checks, run by CI before the tests and by hand before a commit (docs/contributing.md):
# ruff lint, ruff format --check, mypy (0 errors) and vulture (dead code), every setting in
# pyproject.toml. Sets up the virtual env when needed (mypy reads torch's and transformers'
# types) and installs the dev extra's pinned tools into it when missing or at another
# version; safe to run again. Runs every check, then fails if any failed.
set -euo pipefail
cd "$(dirname "$0")/.."

VENV=${COMLRL_VENV:-.venv}
quiet_pip() { # pip's find-links mirror prints a warning per package; keep real errors
  "$VENV/bin/pip" install --disable-pip-version-check -q "$@" 2>&1 | grep -v "is ignored: it is neither" || true
  return "${PIPESTATUS[0]}"
}

if [ ! -x "$VENV/bin/python" ] || ! "$VENV/bin/python" -c "import comlrl_core, torch, transformers" 2>/dev/null; then
  echo "[check] setting up the virtual env (scripts/setup.sh, without Docker)"
  COMLRL_SKIP_DOCKER=1 bash scripts/setup.sh
fi

# The pins live in one place: the dev extra of pyproject.toml.
mapfile -t DEV_TOOLS < <("$VENV/bin/python" - <<'PY'
import re

text = open("pyproject.toml", encoding="utf-8").read()
match = re.search(r"^dev = \[(.*?)\]", text, re.M | re.S)
if match is None:
    raise SystemExit("pyproject.toml has no dev extra (dev = [...]) to take the tool pins from")
for requirement in re.findall(r'"([^"]+)"', match.group(1)):
    print(requirement)
PY
)
if ! "$VENV/bin/python" - "${DEV_TOOLS[@]}" <<'PY'
import importlib.metadata
import sys

for requirement in sys.argv[1:]:
    name, _, pinned = requirement.partition("==")
    try:
        installed = importlib.metadata.version(name)
    except importlib.metadata.PackageNotFoundError:
        sys.exit(1)
    if pinned and installed != pinned:
        sys.exit(1)
PY
then
  echo "[check] installing the pinned dev tools: ${DEV_TOOLS[*]}"
  quiet_pip "${DEV_TOOLS[@]}"
fi

failed=()
run() { # run one check, remember its name when it fails
  local name=$1
  shift
  echo "[check] $name: $*"
  if ! "$@"; then
    failed+=("$name")
  fi
}
run "ruff lint" "$VENV/bin/ruff" check .
run "ruff format" "$VENV/bin/ruff" format --check .
run "mypy" "$VENV/bin/mypy"
run "vulture" "$VENV/bin/vulture"

if [ ${#failed[@]} -gt 0 ]; then
  echo "[check] FAILED: ${failed[*]}" >&2
  exit 1
fi
echo "[check] all passed"
