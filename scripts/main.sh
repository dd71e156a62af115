#!/usr/bin/env bash
# The main job: set up (idempotent), then run `comlrl main` on its embedded default config.
# Extra args go to `comlrl main` (e.g. --out runs/mine, key=value overrides).
# The job runs on tcmalloc when it is installed (setup.sh installs it where apt can): glibc's
# malloc lets the update's freed activations fragment the heap, about 1 GiB more peak RSS
# (docs/performance.md, "Allocator"). COMLRL_ALLOCATOR=glibc|jemalloc chooses another.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
allocator=${COMLRL_ALLOCATOR:-tcmalloc}
if [ "$allocator" != "glibc" ]; then
  if exports=$(.venv/bin/python -m comlrl_core.models.cpu.allocator --exports "$allocator"); then
    eval "$exports"  # LD_PRELOAD (and tcmalloc's quiet large-allocation report), from preload_env
  else
    echo "[main] $allocator not found: running on glibc's malloc (higher peak memory)" >&2
  fi
fi
exec .venv/bin/comlrl main "$@"
