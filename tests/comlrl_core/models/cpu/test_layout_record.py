"""Layout measurements kept on disk (comlrl_core.models.cpu.layout_record), so that a later
process on the same machine decides as the first one did."""

from __future__ import annotations

import json
import logging

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from comlrl_core.models.cpu import fp32_layout, layout_record

WEIGHTS = [torch.zeros(8, 8), torch.zeros(16, 8)]
MERGED_PROCESSES = fp32_layout.RECORD_MEASUREMENTS  # the library's default, before any fixture


@pytest.fixture
def record_file(monkeypatch, tmp_path):
    """A record of its own (conftest starts the process without measurements)."""
    path = tmp_path / "cache" / "layout.json"
    monkeypatch.setenv(layout_record.ENV_VAR, str(path))
    monkeypatch.setenv(fp32_layout.ENV_VAR, "auto")
    monkeypatch.setattr(fp32_layout, "MEASURE_MIN_BYTES", 0)
    monkeypatch.setattr(layout_record, "_warned", set())
    # one process's measurement decides (the merging of the first few is tested on its own)
    monkeypatch.setattr(fp32_layout, "RECORD_MEASUREMENTS", 1)
    return path


def _measuring(monkeypatch, plain_ms: float, packed_ms: float, pack_ms: float) -> list[int]:
    """Replace the timing with fixed figures; returns the row classes it was asked for."""
    calls: list[int] = []

    def measure(weights, rows):
        calls.append(rows)
        return fp32_layout.Measurement(rows, plain_ms, packed_ms, pack_ms, 1.0, torch.get_num_threads(), "oneDNN", 5.0)

    monkeypatch.setattr(fp32_layout, "measure", measure)
    return calls


def _new_process(monkeypatch) -> None:
    monkeypatch.setattr(fp32_layout, "_measured", {})


def test_a_later_process_reads_the_measurement_instead_of_timing(monkeypatch, record_file):
    calls = _measuring(monkeypatch, 60.0, 27.0, 200.0)
    assert fp32_layout.layout_for(WEIGHTS, rows=16, new_tokens=48) == "onednn"
    assert calls == [16] and record_file.exists()

    _new_process(monkeypatch)
    # a fresh timing would now say MKL; the record keeps the decision
    calls = _measuring(monkeypatch, 27.0, 60.0, 200.0)
    assert fp32_layout.layout_for(WEIGHTS, rows=16, new_tokens=48) == "onednn"
    assert calls == []
    (found,) = fp32_layout.measured()
    assert found.recorded
    assert (found.plain_ms, found.packed_ms, found.pack_ms, found.restore_ms) == (60.0, 27.0, 200.0, 5.0)
    assert "recorded by an earlier process" in found.describe()
    # the decision still weighs the call's own length against the recorded costs
    assert fp32_layout.layout_for(WEIGHTS, rows=16, new_tokens=6) == "mkl"


def test_the_first_processes_merge_their_best_passes_then_the_record_decides(monkeypatch, record_file):
    monkeypatch.setattr(fp32_layout, "RECORD_MEASUREMENTS", MERGED_PROCESSES)
    assert MERGED_PROCESSES == 3
    # process 1 times on a busy machine: both passes slow, the saving hidden
    first = _measuring(monkeypatch, 29.2, 28.5, 300.0)
    assert fp32_layout.layout_for(WEIGHTS, rows=16, new_tokens=48) == "mkl"
    # process 2 times on a quiet machine: its best passes are merged in, and decide
    _new_process(monkeypatch)
    second = _measuring(monkeypatch, 20.0, 17.0, 120.0)
    assert fp32_layout.layout_for(WEIGHTS, rows=16, new_tokens=48) == "onednn"
    # process 3 is busy again: the merged record keeps the quiet passes
    _new_process(monkeypatch)
    third_calls = _measuring(monkeypatch, 31.0, 30.0, 400.0)
    assert fp32_layout.layout_for(WEIGHTS, rows=16, new_tokens=48) == "onednn"
    (third,) = fp32_layout.measured()
    assert (third.plain_ms, third.packed_ms, third.pack_ms, third.measurements) == (20.0, 17.0, 120.0, 3)
    assert not third.recorded and "best of 3 processes' measurements" in third.describe()
    assert first == second == third_calls == [16]
    # process 4 reads the record and times nothing
    _new_process(monkeypatch)
    calls = _measuring(monkeypatch, 10.0, 60.0, 1.0)
    assert fp32_layout.layout_for(WEIGHTS, rows=16, new_tokens=48) == "onednn"
    assert calls == []
    (fourth,) = fp32_layout.measured()
    assert fourth.recorded and fourth.measurements == 3
    (stored,) = json.loads(record_file.read_text())["cases"].values()
    assert stored["measurements"] == 3 and stored["plain_ms"] == 20.0


def _parts(measurement: fp32_layout.Measurement) -> tuple[float, float, float, float]:
    return (measurement.plain_ms, measurement.packed_ms, measurement.pack_ms, measurement.restore_ms)


@settings(max_examples=50, deadline=None)
@given(st.lists(st.tuples(*[st.floats(0.01, 1e4, allow_nan=False)] * 4), min_size=1, max_size=5))
def test_merged_measurements_keep_each_parts_best_time(timings):
    measurements = [fp32_layout.Measurement(16, p, q, r, 1.0, 2, "oneDNN", s) for p, q, r, s in timings]
    merged = measurements[0]
    for other in measurements[1:]:
        merged = merged.merged(other)
    assert _parts(merged) == tuple(min(parts) for parts in zip(*timings, strict=True))
    assert merged.measurements == len(timings)
    if len(measurements) > 1:  # the order of merging does not matter
        assert _parts(measurements[1].merged(measurements[0])) == _parts(measurements[0].merged(measurements[1]))


def test_each_case_is_measured_once_other_cases_are_measured(monkeypatch, record_file):
    calls = _measuring(monkeypatch, 60.0, 27.0, 1.0)
    fp32_layout.layout_for(WEIGHTS, rows=16, new_tokens=48)
    fp32_layout.layout_for(WEIGHTS, rows=1, new_tokens=48)
    _new_process(monkeypatch)
    for rows in (1, 16, 3):  # a row class not measured before: timed, and added
        fp32_layout.layout_for(WEIGHTS, rows=rows, new_tokens=48)
    fp32_layout.layout_for([torch.zeros(8, 8)], rows=16, new_tokens=48)  # other weight shapes
    assert calls == [16, 1, 4, 16]
    assert len(json.loads(record_file.read_text())["cases"]) == 4


def test_another_thread_count_or_cpu_is_another_case(monkeypatch, record_file):
    calls = _measuring(monkeypatch, 60.0, 27.0, 1.0)
    fp32_layout.layout_for(WEIGHTS, rows=16, new_tokens=48)
    threads = torch.get_num_threads()
    try:
        _new_process(monkeypatch)
        torch.set_num_threads(threads + 1)
        fp32_layout.layout_for(WEIGHTS, rows=16, new_tokens=48)
    finally:
        torch.set_num_threads(threads)
    _new_process(monkeypatch)
    monkeypatch.setattr(layout_record, "cpu_model_name", lambda: "Another CPU")
    fp32_layout.layout_for(WEIGHTS, rows=16, new_tokens=48)
    assert calls == [16, 16, 16]


def test_off_measures_in_every_process_and_writes_nothing(monkeypatch, record_file):
    monkeypatch.setenv(layout_record.ENV_VAR, "off")
    calls = _measuring(monkeypatch, 60.0, 27.0, 1.0)
    fp32_layout.layout_for(WEIGHTS, rows=16, new_tokens=48)
    _new_process(monkeypatch)
    fp32_layout.layout_for(WEIGHTS, rows=16, new_tokens=48)
    assert calls == [16, 16]
    assert not record_file.exists() and not record_file.parent.exists()
    assert layout_record.record_path() is None


def test_the_default_file_is_in_the_cache_folder(monkeypatch, tmp_path):
    monkeypatch.delenv(layout_record.ENV_VAR)
    monkeypatch.setenv("COMLRL_CACHE", str(tmp_path))
    assert layout_record.record_path() == str(tmp_path / "fp32_layout.json")


@pytest.mark.parametrize(
    "content",
    [
        "{not json",
        json.dumps([1, 2]),
        json.dumps({"format": 1, "cases": {}}),  # an older format (before merged measurements)
        None,  # the right format, a case with another version's fields
    ],
)
def test_an_unusable_record_is_measured_over_and_rewritten(monkeypatch, record_file, caplog, content):
    calls = _measuring(monkeypatch, 60.0, 27.0, 1.0)
    record_file.parent.mkdir(parents=True)
    if content is None:
        fp32_layout.layout_for(WEIGHTS, rows=16, new_tokens=48)
        cases = json.loads(record_file.read_text())["cases"]
        for fields in cases.values():
            fields["plain_ms"] = "fast"  # not a number
            fields.pop("restore_ms")
        record_file.write_text(json.dumps({"format": layout_record._FORMAT, "cases": cases}))
        _new_process(monkeypatch)
        calls.clear()
    else:
        record_file.write_text(content)
    with caplog.at_level(logging.WARNING, logger=layout_record.__name__):
        assert fp32_layout.layout_for(WEIGHTS, rows=16, new_tokens=48) == "onednn"
    assert calls == [16]
    assert ("unreadable" in caplog.text) == (content == "{not json")
    _new_process(monkeypatch)
    fp32_layout.layout_for(WEIGHTS, rows=16, new_tokens=48)
    assert calls == [16]  # the rewritten record serves the next process


def test_an_unwritable_folder_warns_once_and_keeps_the_decision(monkeypatch, record_file, caplog):
    record_file.parent.write_text("")  # the record's folder is a file
    calls = _measuring(monkeypatch, 60.0, 27.0, 1.0)
    with caplog.at_level(logging.WARNING, logger=layout_record.__name__):
        assert fp32_layout.layout_for(WEIGHTS, rows=16, new_tokens=48) == "onednn"
        assert fp32_layout.layout_for(WEIGHTS, rows=1, new_tokens=48) == "onednn"
    assert calls == [16, 1]
    assert caplog.text.count("not written") == 1


def test_the_mkl_packing_decision_is_recorded_apart(monkeypatch, record_file):
    layout_calls = _measuring(monkeypatch, 60.0, 27.0, 1.0)
    packing_calls: list[int] = []

    def measure_mkl(weights, rows):
        packing_calls.append(rows)
        return fp32_layout.Measurement(rows, 7.2, 3.5, 1.0, 1.0, torch.get_num_threads(), "MKL")

    monkeypatch.setattr(fp32_layout, "measure_mkl_packing", measure_mkl)
    fp32_layout.layout_for(WEIGHTS, rows=1, new_tokens=48)
    assert fp32_layout.mkl_packing_pays(WEIGHTS, rows=1, new_tokens=48) is True
    _new_process(monkeypatch)
    assert fp32_layout.mkl_packing_pays(WEIGHTS, rows=1, new_tokens=48) is True
    assert fp32_layout.layout_for(WEIGHTS, rows=1, new_tokens=48) == "onednn"
    assert (layout_calls, packing_calls) == ([1], [1])
    assert {m.packed_as for m in fp32_layout.measured()} == {"MKL", "oneDNN"}


@settings(max_examples=25, deadline=None)
@given(
    st.lists(
        st.tuples(
            st.sampled_from(["decoding layout", "packing of the large weights"]),
            st.integers(1, 64),
            st.floats(0.0, 1e4, allow_nan=False),
        ),
        min_size=1,
        max_size=6,
    )
)
def test_recorded_cases_read_back_exactly(tmp_path_factory, cases):
    path = tmp_path_factory.mktemp("record") / "layout.json"
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv(layout_record.ENV_VAR, str(path))
        expected = {}
        for kind, rows, figure in cases:
            key = layout_record.case_key(kind, [[[rows, 8]]], rows, 2)
            fields = {"rows": rows, "plain_ms": figure, "packed_as": kind[:3]}
            layout_record.record(key, fields)
            expected[key] = fields
        assert {key: layout_record.recorded(key) for key in expected} == expected
        assert not [p for p in path.parent.iterdir() if p.name != path.name]  # no staging files left
