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
# PyTorch backs tensors of 2 MiB and more with transparent huge pages: the job hands freed
# memory back to the OS between phases (release_freed_memory), and paging it in again takes
# about half as long in 2 MiB pages as in 4 KiB ones (bench/page_in.py, docs/performance.md)
export THP_MEM_ALLOC_ENABLE=${THP_MEM_ALLOC_ENABLE:-1}
exec .venv/bin/comlrl main "$@"
