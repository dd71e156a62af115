"""The sandbox's Docker image: built locally, never pulled from a registry.

The image is a minimal Debian root file system (``debootstrap --variant=minbase
--include=python3``) imported with ``docker import``. It holds nothing but Python and its
standard library (``python3-minimal`` alone lacks most of the stdlib, ``json`` included).
The fork server that runs programs is passed at container start (``python3 -c``), so the
image never needs rebuilding when the harness changes.

The tag is a hash of the build recipe (a "content tag"): a changed recipe gives a new tag,
and an existing tag is reused without building. ``python -m sandbox.image`` builds it
(``--force`` rebuilds); ``comlrl sandbox build-image`` does the same.
"""

from __future__ import annotations

import argparse
import glob
import hashlib
import json
import os
import shutil
import subprocess
import sys
import tarfile
import tempfile
import time
from typing import Any, Callable

IMAGE_REPOSITORY = "comlrl-sandbox"
IMAGE_LABEL = "comlrl.sandbox.image"
DEFAULT_MIRROR = "http://deb.debian.org/debian"

# Everything that decides the image's content. Bump "revision" when the build steps change.
RECIPE: dict[str, Any] = {
    "revision": 2,
    "suite": "bookworm",
    "variant": "minbase",
    "include": ["python3"],
    "trim": [
        "usr/share/doc",
        "usr/share/man",
        "usr/share/info",
        "usr/share/locale",
        "var/cache/apt",
        "var/lib/apt/lists",
        "var/log",
    ],
    # Extension modules that give raw memory access (ctypes) or test-only C APIs: a program
    # (or a Python it starts) must not find them.
    "remove": [
        "usr/lib/python3.11/lib-dynload/_ctypes*.so",
        "usr/lib/python3.11/lib-dynload/_test*.so",
        "usr/lib/python3.11/lib-dynload/_xx*.so",
        "usr/lib/python3.11/lib-dynload/xxlimited*.so",
    ],
    # Execute-only interpreter: the kernel makes every process that runs it non-dumpable, so
    # no process in the container can read another's memory (or its own /proc/self/mem).
    "execute_only": ["usr/bin/python3.11"],
}


def image_tag(recipe: dict[str, Any] | None = None) -> str:
    """``comlrl-sandbox:<suite>-<hash>``, the content tag of ``recipe``."""
    recipe = RECIPE if recipe is None else recipe
    digest = hashlib.sha256(json.dumps(recipe, sort_keys=True).encode()).hexdigest()[:12]
    return f"{IMAGE_REPOSITORY}:{recipe['suite']}-{digest}"


def docker_client(timeout: float = 120.0, max_pool_size: int = 10):
    """A docker SDK client from the environment; SandboxUnavailable when no engine answers."""
    from .types import SandboxUnavailable

    try:
        import docker
    except ImportError as err:  # pragma: no cover - docker is a hard dependency
        raise SandboxUnavailable("the 'docker' Python package is not installed") from err
    try:
        client = docker.from_env(timeout=timeout, max_pool_size=max_pool_size)
        client.ping()
    except Exception as err:  # noqa: BLE001 - any failure means "no engine"
        raise SandboxUnavailable(
            f"no Docker engine answers ({type(err).__name__}: {err}); start one with "
            "`bash scripts/setup_docker.sh` or use backend='process'"
        ) from err
    return client


def image_exists(client, tag: str | None = None) -> bool:
    import docker.errors

    try:
        client.images.get(tag or image_tag())
        return True
    except docker.errors.ImageNotFound:
        return False


def _debootstrap(rootfs: str, mirror: str, log: Callable[[str], None]) -> None:
    exe = shutil.which("debootstrap")
    if exe is None:
        raise RuntimeError(
            "debootstrap is not installed; install it with `apt-get install debootstrap` "
            "(scripts/setup_docker.sh does this)"
        )
    cmd = [
        exe,
        f"--variant={RECIPE['variant']}",
        f"--include={','.join(RECIPE['include'])}",
        RECIPE["suite"],
        rootfs,
        mirror,
    ]
    log("running: " + " ".join(cmd))
    proc = subprocess.run(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    if proc.returncode != 0:
        tail = "\n".join(proc.stdout.splitlines()[-20:])
        raise RuntimeError(f"debootstrap failed (exit {proc.returncode}):\n{tail}")


def build_image(client=None, force: bool = False, mirror: str | None = None, log: Callable[[str], None] = print) -> str:
    """Build the sandbox image unless its content tag exists; return the tag."""
    client = client or docker_client()
    tag = image_tag()
    if not force and image_exists(client, tag):
        log(f"image {tag} exists")
        return tag
    mirror = mirror or os.environ.get("COMLRL_DEBIAN_MIRROR", DEFAULT_MIRROR)
    start = time.monotonic()
    workdir = tempfile.mkdtemp(prefix="comlrl-sandbox-image-")
    try:
        rootfs = os.path.join(workdir, "rootfs")
        _debootstrap(rootfs, mirror, log)
        for rel in RECIPE["trim"]:  # docs, caches and logs: not needed to run Python
            path = os.path.join(rootfs, rel)
            if os.path.isdir(path):
                shutil.rmtree(path)
                os.makedirs(path)
        for pattern in RECIPE["remove"]:
            for path in glob.glob(os.path.join(rootfs, pattern)):
                os.unlink(path)
        for rel in RECIPE["execute_only"]:
            os.chmod(os.path.join(rootfs, rel), 0o711)
        archive = os.path.join(workdir, "rootfs.tar")
        with tarfile.open(archive, "w") as tar:
            for name in sorted(os.listdir(rootfs)):
                tar.add(os.path.join(rootfs, name), arcname=name)
        repository, version = tag.split(":")
        changes = [f"LABEL {IMAGE_LABEL}={version}", 'CMD ["python3"]', "USER 65534:65534", "ENV LANG=C.UTF-8"]
        log(f"importing {tag}")
        client.api.import_image_from_file(archive, repository=repository, tag=version, changes=changes)
    finally:
        shutil.rmtree(workdir, ignore_errors=True)
    if not image_exists(client, tag):
        raise RuntimeError(f"docker import did not produce {tag}")
    log(f"built {tag} in {time.monotonic() - start:.0f}s")
    return tag


def image_status(client) -> dict[str, Any]:
    """The image's tag, whether it exists, its size, and older sandbox images."""
    tag = image_tag()
    info: dict[str, Any] = {"tag": tag, "exists": False}
    for image in client.images.list(name=IMAGE_REPOSITORY):
        if tag in image.tags:
            info.update(exists=True, id=image.short_id, size_mb=round(image.attrs["Size"] / 2**20))
        else:
            info.setdefault("stale_tags", []).extend(image.tags)
    return info


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m sandbox.image", description=__doc__.split("\n")[0])
    parser.add_argument("--force", action="store_true", help="rebuild even when the tag exists")
    parser.add_argument("--mirror", default=None, help=f"Debian mirror (default {DEFAULT_MIRROR})")
    args = parser.parse_args(argv)
    try:
        build_image(force=args.force, mirror=args.mirror)
    except Exception as err:  # noqa: BLE001 - report, exit non-zero
        print(f"sandbox image build failed: {err}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
