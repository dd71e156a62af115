"""``comlrl sandbox ...`` subcommands (found through the ``comlrl.commands`` entry point).

comlrl sandbox build-image [--force] [--mirror URL]   build the Docker image
comlrl sandbox status [--prune]                        engine, image, pool containers
"""

from __future__ import annotations

import argparse


def add_commands(subparsers: argparse._SubParsersAction) -> None:
    parser = subparsers.add_parser(
        "sandbox",
        help="manage the code sandbox (Docker image, pools)",
        description="Manage the code sandbox: its Docker image and pools.",
    )
    commands = parser.add_subparsers(dest="sandbox_command", metavar="SANDBOX_COMMAND")
    parser.set_defaults(func=lambda args: parser.print_help() or 2)

    build = commands.add_parser(
        "build-image", help="build the sandbox image locally (debootstrap + docker import; no registry pull)"
    )
    build.add_argument("--force", action="store_true", help="rebuild even when the tag exists")
    build.add_argument("--mirror", default=None, help="Debian mirror URL")
    build.set_defaults(func=_build_image)

    status = commands.add_parser("status", help="show the Docker engine, the image and the sandbox containers")
    status.add_argument("--prune", action="store_true", help="remove containers whose owner process is gone")
    status.set_defaults(func=_status)


def _build_image(args: argparse.Namespace) -> int:
    from .image import build_image
    from .types import SandboxUnavailable

    try:
        build_image(force=args.force, mirror=args.mirror)
    except (SandboxUnavailable, RuntimeError) as err:
        print(f"error: {err}")
        return 1
    return 0


def _status(args: argparse.Namespace) -> int:
    from .docker_backend import owner_alive, remove_stale_containers, sandbox_containers
    from .image import docker_client, image_status, image_tag
    from .process_backend import network_isolation
    from .types import SandboxUnavailable

    print(f"process backend network isolation: {network_isolation()[1]}")
    try:
        client = docker_client(timeout=10)
    except SandboxUnavailable as err:
        print(f"docker engine: not available ({err})")
        print(f"image: {image_tag()} (unknown)")
        return 1
    version = client.version()
    print(f"docker engine: {version.get('Version', '?')} (storage driver {client.info().get('Driver', '?')})")
    info = image_status(client)
    state = f"present, {info['size_mb']} MiB" if info["exists"] else "missing (run `comlrl sandbox build-image`)"
    print(f"image: {info['tag']} {state}")
    if info.get("stale_tags"):
        print(f"older sandbox images: {', '.join(info['stale_tags'])}")
    if args.prune:
        removed = remove_stale_containers(client)
        print(f"removed {len(removed)} stale containers")
    containers = sandbox_containers(client)
    print(f"sandbox containers: {len(containers)}")
    for container in containers:
        labels = container.labels
        owner = f"{labels.get('comlrl.sandbox.owner_host', '?')}:{labels.get('comlrl.sandbox.owner_pid', '?')}"
        alive = "owner alive" if owner_alive(labels) else "STALE (owner gone)"
        print(f"  {container.short_id} {container.status:<9} owner {owner} {alive}")
    return 0 if info["exists"] else 1
