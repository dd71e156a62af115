"""Shared pieces of the reliability suite: a tiny Writing-v0 run on the command line,
in-process, and ways to damage a checkpoint."""

from __future__ import annotations

import json
import pathlib

from comlrl_core.cli import main as comlrl_main

PASSAGES = [
    "The old mill stands by the river and grinds wheat for the town every autumn.",
    "A small fox lives near the farm and hunts mice in the tall grass at night.",
]


def write_passages(folder: pathlib.Path) -> str:
    path = folder / "passages.json"
    path.write_text(json.dumps([{"passage": p} for p in PASSAGES]))
    return str(path)


def tiny_train_args(output_dir: pathlib.Path, data_file: str, *extra: str, flags: tuple[str, ...] = ()) -> list[str]:
    """``comlrl train magrpo`` on the tiny random model: one turn, short answers, one update per step."""
    return [
        "train",
        "magrpo",
        "--env",
        "comlrl/Writing-v0",
        *flags,
        f"output_dir={output_dir}",
        "num_turns=1",
        "num_generations=2",
        "max_new_tokens=4",
        "rollout_buffer_size=1",
        "num_train_epochs=10",
        "eval_interval=0",
        "progress_bar=false",
        "device=cpu",
        "agent_models=[tiny-random]",
        f"env_kwargs={{data_file: {data_file}}}",
        *extra,
    ]


def run_cli(argv: list[str], capsys) -> tuple[int, str]:
    """Exit code and stderr of ``comlrl`` run in this process."""
    code = comlrl_main(argv)
    return code, capsys.readouterr().err


def flip_a_byte(checkpoint: pathlib.Path) -> pathlib.Path:
    """Flip one byte in the middle of the checkpoint's largest file (its size stays)."""
    target = max((p for p in checkpoint.rglob("*") if p.is_file() and p.name != "manifest.json"), key=_size)
    data = bytearray(target.read_bytes())
    data[len(data) // 2] ^= 0x01
    target.write_bytes(bytes(data))
    return target


def _size(path: pathlib.Path) -> int:
    return path.stat().st_size


def metric_steps(run_dir: pathlib.Path, key: str = "turn_1/reward_mean") -> list[int]:
    rows = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines() if line.strip()]
    return [row["step"] for row in rows if key in row]
