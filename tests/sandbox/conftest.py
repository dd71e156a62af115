"""Fixtures for the sandbox tests.

Tests marked ``docker`` need a Docker engine and the sandbox image. Without them they
SKIP (printing why) on a developer machine, and FAIL loudly under ``CI=true``, where
scripts/setup_docker.sh must have provided both.
"""

from __future__ import annotations

import functools
import os

import pytest

from sandbox import Sandbox


@functools.lru_cache(maxsize=1)
def docker_problem() -> str | None:
    """Why Docker tests cannot run here, or None when they can."""
    from sandbox.image import docker_client, image_exists, image_tag
    from sandbox.types import SandboxUnavailable

    try:
        client = docker_client(timeout=10)
    except SandboxUnavailable as err:
        return str(err)
    if not image_exists(client, image_tag()):
        return f"the sandbox image {image_tag()} is missing (run `comlrl sandbox build-image`)"
    return None


def require_docker() -> None:
    """Skip (or, under CI=true, fail) unless Docker and the image are usable."""
    problem = docker_problem()
    if problem is None:
        return
    if os.environ.get("CI", "").lower() == "true":
        pytest.fail(f"CI=true but Docker is unusable: {problem}", pytrace=False)
    print(f"skipping Docker test: {problem}")
    pytest.skip(f"Docker unavailable: {problem}")


@pytest.fixture(autouse=True)
def _require_docker(request):
    if request.node.get_closest_marker("docker") is not None:
        require_docker()


@pytest.fixture(scope="session")
def docker_box():
    """A warm two-container pool shared by the Docker tests."""
    require_docker()  # session fixtures run before the autouse one above
    box = Sandbox(backend="docker", pool_size=2, timeout=5.0)
    box.start()
    yield box
    box.close()


@pytest.fixture(scope="module")
def process_box():
    with Sandbox(backend="process", pool_size=2, timeout=5.0) as box:
        yield box
