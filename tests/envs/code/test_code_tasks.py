"""Task sources: HumanEval offline, the shared CoopHumanEval / MBPP files, hub, splits."""

import gzip
import json
import os
import pathlib
import sys
import types

import pytest

from envs.code import CoopCodeEnv
from envs.code.tasks import TaskFormatError, load_tasks, normalise_record, read_records


def _shared_data_dir() -> pathlib.Path:
    """The project's shared/ folder sits beside the checkout (CI clones keep it there)."""
    repo = pathlib.Path(__file__).resolve().parents[3]
    for candidate in (os.environ.get("COMLRL_SHARED_DATA"), repo.parent / "shared" / "data", "/work/shared/data"):
        if candidate and (pathlib.Path(candidate) / "coophumaneval.json").is_file():
            return pathlib.Path(candidate)
    raise FileNotFoundError(
        "shared/data (coophumaneval.json, mbpp-py-reworded.json) not found beside the "
        "checkout; set COMLRL_SHARED_DATA to its folder"
    )


COOP = str(_shared_data_dir() / "coophumaneval.json")
MBPP = str(_shared_data_dir() / "mbpp-py-reworded.json")
FIELDS = {
    "task_id",
    "prompt",
    "entry_point",
    "test",
    "test_setup",
    "test_statements",
    "assert_indices",
    "candidate_name",
    "canonical_solution",
    "source",
}


def _check_records(tasks):
    for t in tasks:
        assert set(t) == FIELDS
        assert t["entry_point"].isidentifier()
        assert t["assert_indices"] and all(0 <= i < len(t["test_statements"]) for i in t["assert_indices"])
        assert "def check(" in t["test"] and "test_check" not in t["test"]


def test_humaneval_offline_from_the_package():
    tasks = load_tasks("humaneval")
    assert len(tasks) == 164
    _check_records(tasks)
    first = tasks[0]
    assert first["task_id"] == "HumanEval/0" and first["entry_point"] == "has_close_elements"
    assert first["canonical_solution"] and first["source"] == "humaneval"
    assert len(first["assert_indices"]) == 7
    # HumanEval/32 checks with setup statements and one loop: only the loop is a test
    he32 = tasks[32]
    assert he32["assert_indices"] == [len(he32["test_statements"]) - 1]


def test_coophumaneval_from_local_json():
    tasks = load_tasks("coophumaneval", data_path=COOP)
    assert len(tasks) == 82
    _check_records(tasks)
    assert tasks[0]["task_id"] == "CoopHumanEval/0" and tasks[0]["entry_point"] == "x_or_y"
    assert tasks[0]["test_statements"][0] == "assert candidate(7, 34, 12) == 34"
    assert tasks[15]["test_setup"].startswith("METADATA")


def test_mbpp_multipl_e_file_infers_entry_point_and_drops_test_check():
    tasks = load_tasks("mbpp", data_path=MBPP)
    assert len(tasks) == 397
    _check_records(tasks)
    assert tasks[0]["task_id"] == "mbpp_464_check_value" and tasks[0]["entry_point"] == "check_value"
    assert tasks[0]["canonical_solution"] is None and len(tasks[0]["assert_indices"]) == 3


def test_dataset_may_be_a_path(tmp_path):
    path = tmp_path / "few.jsonl.gz"
    with gzip.open(path, "wt") as fh:
        for rec in json.load(open(COOP))[:3]:
            fh.write(json.dumps(rec) + "\n")
    tasks = load_tasks(str(path))
    assert [t["task_id"] for t in tasks] == ["CoopHumanEval/0", "CoopHumanEval/1", "CoopHumanEval/2"]
    assert tasks[0]["source"] == "file"


def test_json_object_with_data_key(tmp_path):
    path = tmp_path / "wrapped.json"
    path.write_text(json.dumps({"data": json.load(open(COOP))[:2]}))
    assert len(read_records(str(path))) == 2


def test_original_mbpp_test_list_format():
    rec = normalise_record(
        {
            "task_id": 2,
            "text": "Add two numbers.",
            "code": "def add(a, b):\n    return a + b\n",
            "test_list": ["assert add(1, 2) == 3", "assert add(0, 0) == 0"],
        }
    )
    assert rec["entry_point"] == "add"
    assert rec["test_statements"] == ["assert candidate(1, 2) == 3", "assert candidate(0, 0) == 0"]
    assert "add" in rec["prompt"] and rec["canonical_solution"].startswith("def add")


def test_hub_path_uses_load_dataset(monkeypatch):
    seen = {}

    def fake_load_dataset(*args, split):
        seen["args"], seen["split"] = args, split
        return [dict(r) for r in json.load(open(COOP))[:4]]

    monkeypatch.setitem(sys.modules, "datasets", types.SimpleNamespace(load_dataset=fake_load_dataset))
    tasks = load_tasks("coophumaneval")
    assert seen == {"args": ("OpenMLRL/CoopHumanEval",), "split": "test"}
    assert len(tasks) == 4
    monkeypatch.setitem(
        sys.modules,
        "datasets",
        types.SimpleNamespace(load_dataset=lambda *a, split: [dict(r) for r in json.load(open(MBPP))[:2]]),
    )
    assert len(load_tasks("mbpp", dataset_id="me/my-mbpp", split="train")) == 2


def test_hub_without_datasets_says_how_to_fix(monkeypatch):
    monkeypatch.setitem(sys.modules, "datasets", None)  # import datasets -> ImportError
    with pytest.raises(ImportError, match="pip install datasets"):
        load_tasks("coophumaneval")


@pytest.mark.parametrize(
    "raw, match",
    [
        ({"prompt": "x"}, "needs string fields"),
        ({"prompt": "def f(): pass", "test": "assert f() is None"}, "no `def check"),
        ({"prompt": "def f(): pass", "test": "def check(:"}, "does not parse"),
        ("just text", "expected an object"),
    ],
)
def test_bad_records_raise_clear_errors(raw, match):
    with pytest.raises(TaskFormatError, match=match):
        normalise_record(raw)


def test_unknown_dataset_name():
    with pytest.raises(ValueError, match="neither one of"):
        load_tasks("nope-not-a-dataset")


@pytest.mark.parametrize(
    "task_slice, expected",
    [
        ("0:60", list(range(60))),
        ("60:", list(range(60, 82))),
        (":-20", list(range(62))),
        (slice(0, 10, 2), [0, 2, 4, 6, 8]),
    ],
)
def test_train_eval_splits_by_slice(task_slice, expected):
    env = CoopCodeEnv(dataset="coophumaneval", data_path=COOP, task_slice=task_slice)
    assert env.num_tasks == len(expected)
    assert [env.task(i)["task_id"] for i in range(env.num_tasks)] == [f"CoopHumanEval/{i}" for i in expected]
    obs, _ = env.reset(options={"task": 0})
    assert env.task(0)["prompt"].strip()[:30] in obs["main"]


def test_train_and_eval_splits_are_disjoint_and_cover_everything():
    train = CoopCodeEnv(dataset="mbpp", data_path=MBPP, task_slice=":-50")
    evals = CoopCodeEnv(dataset="mbpp", data_path=MBPP, task_slice="-50:")
    ids_train = {train.task(i)["task_id"] for i in range(train.num_tasks)}
    ids_eval = {evals.task(i)["task_id"] for i in range(evals.num_tasks)}
    assert not ids_train & ids_eval and len(ids_train | ids_eval) == 397
