"""Checkpoints: exact restore, atomicity and crash safety, discovery and rotation."""

from __future__ import annotations

import json
import os
import pathlib
import random

import numpy as np
import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from comlrl_core.run.checkpoint import (
    CheckpointError,
    checkpoint_path,
    cleanup_incomplete,
    latest_checkpoint,
    list_checkpoints,
    load_checkpoint,
    read_extra_file,
    rotate_checkpoints,
    save_checkpoint,
    verify_checkpoint,
)


class ModulePolicy:
    """The duck-typed policy the checkpoint code expects: save(dir) / load(dir)."""

    def __init__(self, seed: int) -> None:
        torch.manual_seed(seed)
        self.module = torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.Tanh(), torch.nn.Linear(8, 2))

    def save(self, directory: str) -> None:
        torch.save(self.module.state_dict(), os.path.join(directory, "weights.pt"))

    def load(self, directory: str) -> None:
        self.module.load_state_dict(torch.load(os.path.join(directory, "weights.pt"), weights_only=True))


def _train_steps(policy: ModulePolicy, opt: torch.optim.Optimizer, steps: int, gen: torch.Generator) -> None:
    for _ in range(steps):
        x = torch.randn(16, 4, generator=gen)
        loss = policy.module(x).pow(2).mean()
        opt.zero_grad()
        loss.backward()
        opt.step()


def _draws(gen: torch.Generator, np_gen: np.random.Generator) -> list:
    return [
        random.random(),
        float(np.random.rand()),
        torch.rand(3).tolist(),
        torch.rand(3, generator=gen).tolist(),
        np_gen.integers(0, 10**9, size=3).tolist(),
    ]


def test_restore_is_exact(tmp_path: pathlib.Path) -> None:
    policy = ModulePolicy(seed=0)
    opt = torch.optim.AdamW(policy.module.parameters(), lr=1e-2, weight_decay=0.1)
    gen = torch.Generator().manual_seed(123)
    np_gen = np.random.default_rng(7)
    _train_steps(policy, opt, 3, gen)
    random.seed(5)
    np.random.seed(6)
    torch.manual_seed(8)
    _draws(gen, np_gen)  # move every generator away from its seed state

    path = save_checkpoint(
        checkpoint_path(tmp_path, 3),
        policies={"main": policy},
        optimizers={"main": opt},
        generators={"data": gen, "np": np_gen},
        cursor={"step": 3, "epoch": 0, "history": [0.5, 0.25]},
    )
    expected_params = [p.detach().clone() for p in policy.module.parameters()]
    expected_draws = _draws(gen, np_gen)
    _train_steps(policy, opt, 2, gen)  # diverge: params, AdamW moments, generator

    # Fresh objects, different init: everything must come from the checkpoint.
    policy2 = ModulePolicy(seed=99)
    opt2 = torch.optim.AdamW(policy2.module.parameters(), lr=1e-2, weight_decay=0.1)
    gen2 = torch.Generator().manual_seed(0)
    np_gen2 = np.random.default_rng(0)
    cursor = load_checkpoint(
        path, policies={"main": policy2}, optimizers={"main": opt2}, generators={"data": gen2, "np": np_gen2}
    )
    assert cursor == {"step": 3, "epoch": 0, "history": [0.5, 0.25]}
    for got, want in zip(policy2.module.parameters(), expected_params, strict=True):
        assert torch.equal(got, want)
    assert _draws(gen2, np_gen2) == expected_draws

    # Optimizer state (AdamW exp_avg / exp_avg_sq / step) restored exactly, so training
    # continues bit-identically: replay both from the checkpoint and compare.
    load_checkpoint(path, policies={"main": policy2}, optimizers={"main": opt2}, generators={"data": gen2})
    policy3 = ModulePolicy(seed=42)
    opt3 = torch.optim.AdamW(policy3.module.parameters(), lr=1e-2, weight_decay=0.1)
    gen3 = torch.Generator()
    load_checkpoint(path, policies={"main": policy3}, optimizers={"main": opt3}, generators={"data": gen3})
    state2, state3 = opt2.state_dict()["state"], opt3.state_dict()["state"]
    assert state2.keys() == state3.keys() and len(state2) == 4
    for k in state2:
        assert torch.equal(state2[k]["exp_avg"], state3[k]["exp_avg"])
        assert torch.equal(state2[k]["exp_avg_sq"], state3[k]["exp_avg_sq"])
        assert float(state3[k]["step"]) == 3.0
    _train_steps(policy2, opt2, 2, gen2)
    _train_steps(policy3, opt3, 2, gen3)
    for a, b in zip(policy2.module.parameters(), policy3.module.parameters(), strict=True):
        assert torch.equal(a, b)


def test_manifest_lists_every_file_with_hash_and_marker_last(tmp_path: pathlib.Path) -> None:
    path = save_checkpoint(
        tmp_path / "checkpoint-000001",
        policies={"a": ModulePolicy(0)},
        extra_files={"notes/readme.txt": b"hello"},
        cursor={"step": 1},
    )
    manifest_text = (path / "manifest.json").read_text()
    manifest = json.loads(manifest_text)
    assert list(manifest)[-1] == "complete" and manifest["complete"] is True
    on_disk = {p.relative_to(path).as_posix() for p in path.rglob("*") if p.is_file()} - {"manifest.json"}
    assert set(manifest["files"]) == on_disk
    assert {"policies/a/weights.pt", "rng.pt", "cursor.json", "extra/notes/readme.txt"} <= on_disk
    assert read_extra_file(path, "notes/readme.txt") == b"hello"
    assert not [p for p in tmp_path.iterdir() if ".tmp-" in p.name]


def _corrupt(kind: str, path: pathlib.Path) -> None:
    if kind == "no_manifest":
        (path / "manifest.json").unlink()
    elif kind == "marker_false":
        manifest = json.loads((path / "manifest.json").read_text())
        manifest["complete"] = False
        (path / "manifest.json").write_text(json.dumps(manifest))
    elif kind == "torn_manifest":
        text = (path / "manifest.json").read_text()
        (path / "manifest.json").write_text(text[: len(text) // 2])
    elif kind == "truncated_file":
        weights = path / "policies" / "main" / "weights.pt"
        weights.write_bytes(weights.read_bytes()[:-10])
    elif kind == "flipped_byte":
        weights = path / "policies" / "main" / "weights.pt"
        data = bytearray(weights.read_bytes())
        data[len(data) // 2] ^= 0xFF
        weights.write_bytes(bytes(data))
    elif kind == "missing_file":
        (path / "cursor.json").unlink()
    else:
        raise AssertionError(kind)


@pytest.mark.parametrize(
    "kind", ["no_manifest", "marker_false", "torn_manifest", "truncated_file", "flipped_byte", "missing_file"]
)
def test_damaged_checkpoint_is_never_used(tmp_path: pathlib.Path, kind: str) -> None:
    policy = ModulePolicy(0)
    good = save_checkpoint(checkpoint_path(tmp_path, 10), policies={"main": policy}, cursor={"step": 10})
    bad = save_checkpoint(checkpoint_path(tmp_path, 20), policies={"main": policy}, cursor={"step": 20})
    _corrupt(kind, bad)
    assert latest_checkpoint(tmp_path) == good
    with pytest.raises(CheckpointError):
        load_checkpoint(bad, policies={"main": ModulePolicy(1)})
    # nothing was restored from the damaged checkpoint
    target = ModulePolicy(1)
    before = [p.clone() for p in target.module.parameters()]
    with pytest.raises(CheckpointError):
        load_checkpoint(bad, policies={"main": target})
    assert all(torch.equal(a, b) for a, b in zip(before, target.module.parameters(), strict=True))


def test_tmp_leftover_is_ignored_and_cleaned(tmp_path: pathlib.Path) -> None:
    good = save_checkpoint(checkpoint_path(tmp_path, 1), cursor={"step": 1})
    # A save that died mid-way leaves a tmp folder, possibly with a full manifest copy.
    leftover = tmp_path / "checkpoint-000002.tmp-deadbeef"
    save_checkpoint(tmp_path / "scratch", cursor={"step": 2})
    os.replace(tmp_path / "scratch", leftover)
    assert latest_checkpoint(tmp_path) == good
    with pytest.raises(CheckpointError):
        load_checkpoint(leftover)
    removed = cleanup_incomplete(tmp_path)
    assert leftover in removed and not leftover.exists() and good.exists()


def test_crash_during_save_leaves_no_checkpoint(tmp_path: pathlib.Path) -> None:
    class Exploding:
        def save(self, directory: str) -> None:
            pathlib.Path(directory, "part.bin").write_bytes(b"x" * 100)
            raise OSError("disk full")

        def load(self, directory: str) -> None:  # pragma: no cover - never reached
            raise AssertionError

    with pytest.raises(OSError, match="disk full"):
        save_checkpoint(checkpoint_path(tmp_path, 5), policies={"p": Exploding()}, cursor={})
    assert list(tmp_path.iterdir()) == []
    assert latest_checkpoint(tmp_path) is None


def test_replacing_a_checkpoint_keeps_the_old_one_until_the_new_is_in(tmp_path, monkeypatch) -> None:
    path = checkpoint_path(tmp_path, 7)
    save_checkpoint(path, cursor={"version": "old"})

    real_replace = os.replace
    calls = []

    def failing_second_replace(src, dst):
        calls.append((src, dst))
        if len(calls) == 2:  # old moved aside; now the new one's rename "crashes"
            raise OSError("power cut")
        return real_replace(src, dst)

    monkeypatch.setattr(os, "replace", failing_second_replace)
    with pytest.raises(OSError, match="power cut"):
        save_checkpoint(path, cursor={"version": "new"})
    monkeypatch.setattr(os, "replace", real_replace)
    assert load_checkpoint(path, restore_rng=False) == {"version": "old"}

    save_checkpoint(path, cursor={"version": "new"})
    assert load_checkpoint(path, restore_rng=False) == {"version": "new"}
    assert sorted(p.name for p in tmp_path.iterdir()) == ["checkpoint-000007"]


def test_old_aside_is_recovered_by_cleanup(tmp_path: pathlib.Path) -> None:
    path = save_checkpoint(checkpoint_path(tmp_path, 3), cursor={"step": 3})
    aside = tmp_path / "checkpoint-000003.old-0badf00d"
    os.replace(path, aside)  # as if the process died right after moving it aside
    assert latest_checkpoint(tmp_path) is None
    assert cleanup_incomplete(tmp_path) == []
    assert latest_checkpoint(tmp_path) == path
    assert load_checkpoint(path, restore_rng=False) == {"step": 3}


def test_cleanup_removes_incomplete_but_keeps_corrupt_unless_asked(tmp_path: pathlib.Path) -> None:
    incomplete = save_checkpoint(checkpoint_path(tmp_path, 1), cursor={})
    (incomplete / "manifest.json").unlink()
    corrupt = save_checkpoint(checkpoint_path(tmp_path, 2), cursor={})
    (corrupt / "cursor.json").write_text("{}  ")
    good = save_checkpoint(checkpoint_path(tmp_path, 3), cursor={})
    assert cleanup_incomplete(tmp_path) == [incomplete]
    assert corrupt.exists()
    assert cleanup_incomplete(tmp_path, remove_corrupt=True) == [corrupt]
    assert list_checkpoints(tmp_path) == [good]


def test_latest_orders_by_step_and_rotation_keeps_newest(tmp_path: pathlib.Path) -> None:
    assert latest_checkpoint(tmp_path / "missing") is None
    for step in (5, 100, 20):
        save_checkpoint(checkpoint_path(tmp_path, step), cursor={"step": step})
    (tmp_path / "checkpoint-final").mkdir()  # not numbered: ignored
    assert latest_checkpoint(tmp_path) == checkpoint_path(tmp_path, 100)
    assert [p.name for p in list_checkpoints(tmp_path)] == [
        "checkpoint-000005",
        "checkpoint-000020",
        "checkpoint-000100",
    ]
    save_checkpoint(checkpoint_path(tmp_path, 120), cursor={}, keep_last=2)
    assert [p.name for p in list_checkpoints(tmp_path)] == ["checkpoint-000100", "checkpoint-000120"]
    assert rotate_checkpoints(tmp_path, 1) == [checkpoint_path(tmp_path, 100)]


def test_bad_requests_are_clear_errors(tmp_path: pathlib.Path) -> None:
    path = save_checkpoint(checkpoint_path(tmp_path, 1), policies={"main": ModulePolicy(0)}, cursor={})
    with pytest.raises(CheckpointError, match=r"no policy named \['aux'\]"):
        load_checkpoint(path, policies={"aux": ModulePolicy(0)})
    with pytest.raises(CheckpointError, match="no generator"):
        load_checkpoint(path, generators={"g": torch.Generator()})
    with pytest.raises(CheckpointError, match="no checkpoint"):
        load_checkpoint(tmp_path / "nope")
    with pytest.raises(TypeError, match=r"cursor\['t'\] is a tuple"):
        save_checkpoint(checkpoint_path(tmp_path, 2), cursor={"t": (1, 2)})
    with pytest.raises(ValueError, match="policy name"):
        save_checkpoint(checkpoint_path(tmp_path, 2), policies={"../evil": ModulePolicy(0)})
    with pytest.raises(ValueError, match="keep_last"):
        save_checkpoint(tmp_path / "custom", keep_last=2)
    assert not checkpoint_path(tmp_path, 2).exists()
    opt = torch.optim.SGD(torch.nn.Linear(2, 2).parameters(), lr=0.1)
    bigger = torch.optim.SGD([*torch.nn.Linear(2, 2).parameters(), torch.nn.Parameter(torch.zeros(1))], lr=0.1)
    p2 = save_checkpoint(checkpoint_path(tmp_path, 3), optimizers={"o": opt})
    with pytest.raises(CheckpointError, match="optimizer 'o' does not match"):
        load_checkpoint(p2, optimizers={"o": bigger})
    assert verify_checkpoint(p2)["optimizers"] == ["o"]


json_values = st.recursive(
    st.none()
    | st.booleans()
    | st.integers(min_value=-(2**70), max_value=2**70)
    | st.floats(allow_nan=False)
    | st.text(),
    lambda children: st.lists(children, max_size=4) | st.dictionaries(st.text(), children, max_size=4),
    max_leaves=20,
)


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(cursor=st.dictionaries(st.text(), json_values, max_size=6))
def test_cursor_round_trips_exactly(tmp_path: pathlib.Path, cursor: dict) -> None:
    path = save_checkpoint(tmp_path / "checkpoint-000001", cursor=cursor)
    assert load_checkpoint(path, restore_rng=False) == cursor
