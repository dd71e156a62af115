#!/usr/bin/env bash
# The main job: set up (idempotent), then run `comlrl main` on its embedded default config.
# Extra args go to `comlrl main` (e.g. --out runs/mine, key=value overrides).
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
exec .venv/bin/comlrl main "$@"
