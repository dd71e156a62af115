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
  if library=$(.venv/bin/python -m comlrl_core.models.cpu.allocator --library "$allocator"); then
    export LD_PRELOAD="$library${LD_PRELOAD:+:$LD_PRELOAD}"
    export TCMALLOC_LARGE_ALLOC_REPORT_THRESHOLD=${TCMALLOC_LARGE_ALLOC_REPORT_THRESHOLD:-1099511627776}
  else
    echo "[main] $allocator not found: running on glibc's malloc (higher peak memory)" >&2
  fi
fi
exec .venv/bin/comlrl main "$@"
