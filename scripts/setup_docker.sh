#!/usr/bin/env bash
# Prepare a Docker engine and the sandbox image. Idempotent: every step is skipped
# when its result is already there, so CI and developers can run it any number of times.
#
#   1. install docker.io (apt) when `dockerd` is missing
#   2. start `dockerd` in the background when no engine answers (log: $DOCKERD_LOG),
#      falling back to the vfs storage driver when overlay2 cannot start (nested Docker)
#   3. build the sandbox image (debootstrap installed via apt when missing)
#
# Environment: PYTHON (default: .venv/bin/python when present, else python3),
#              DOCKERD_LOG (default /tmp/dockerd.log), DOCKER_WAIT_S (default 60).
set -euo pipefail

cd "$(dirname "$0")/.."
PYTHON="${PYTHON:-}"
if [ -z "$PYTHON" ]; then
    if [ -x .venv/bin/python ]; then PYTHON=.venv/bin/python; else PYTHON=python3; fi
fi
DOCKERD_LOG="${DOCKERD_LOG:-/tmp/dockerd.log}"
DOCKER_WAIT_S="${DOCKER_WAIT_S:-60}"

SUDO=""
if [ "$(id -u)" != "0" ] && command -v sudo >/dev/null 2>&1; then SUDO="sudo"; fi

log() { echo "[setup_docker] $*"; }

apt_updated=0
apt_install() {
    if [ "$apt_updated" = 0 ]; then
        log "apt-get update"
        $SUDO env DEBIAN_FRONTEND=noninteractive apt-get update -qq
        apt_updated=1
    fi
    log "apt-get install $*"
    $SUDO env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends "$@"
}

engine_answers() { docker info >/dev/null 2>&1; }

wait_for_engine() {
    local pid=$1 waited=0
    while ! engine_answers; do
        if ! kill -0 "$pid" 2>/dev/null; then return 1; fi  # dockerd died
        if [ "$waited" -ge "$DOCKER_WAIT_S" ]; then return 1; fi
        sleep 1
        waited=$((waited + 1))
    done
}

start_dockerd() {
    local driver=$1
    log "starting dockerd (storage driver: ${driver:-default}), log: $DOCKERD_LOG"
    local args=()
    if [ -n "$driver" ]; then args+=(--storage-driver "$driver"); fi
    # setsid + nohup: the daemon outlives this script and its terminal.
    $SUDO setsid nohup dockerd "${args[@]}" >>"$DOCKERD_LOG" 2>&1 </dev/null &
    local pid=$!
    if wait_for_engine "$pid"; then return 0; fi
    log "dockerd (${driver:-default}) did not answer; last log lines:"
    tail -n 15 "$DOCKERD_LOG" || true
    $SUDO kill "$pid" 2>/dev/null || true
    sleep 2
    return 1
}

# 1. the engine binaries
if ! command -v dockerd >/dev/null 2>&1; then
    apt_install docker.io
fi

# 2. a running engine
if engine_answers; then
    log "docker engine already answers"
else
    # Inside a container overlay2 on overlayfs usually fails; vfs always works (slower, bigger).
    start_dockerd "${DOCKER_STORAGE_DRIVER:-}" || start_dockerd vfs || {
        log "ERROR: no docker engine answers after ${DOCKER_WAIT_S}s (see $DOCKERD_LOG)"
        exit 1
    }
    log "docker engine answers ($(docker info --format '{{.Driver}}' 2>/dev/null) storage)"
fi

# 3. the sandbox image
if ! command -v debootstrap >/dev/null 2>&1; then
    apt_install debootstrap
fi
"$PYTHON" -m sandbox.image
