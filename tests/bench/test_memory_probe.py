"""bench/memory_probe.py: its options, the cases they make, and one tiny case of each kind.

Only the structure is checked (which cases run, that each reports a peak), never a figure.
"""

from __future__ import annotations

import pytest
from bench_loader import load_bench_script


@pytest.fixture(scope="module")
def probe():
    yield from load_bench_script("memory_probe")


def test_defaults_are_the_main_jobs_shapes(probe):
    args = probe.parse_args([])
    assert (args.rows, args.prompt_tokens, args.new_tokens, args.num_samples) == (48, 470, 96, 2)
    assert args.update_tokens == [1024, 4096] and args.prefill_budget == [2048]
    cases = probe.cases(args)
    assert {c["allocator"] for c in cases} == {"glibc"} and args.update_repeats == 3
    assert [(c["kind"], c.get("prefill_budget"), c.get("tokens"), c["gradient_checkpointing"]) for c in cases] == [
        ("sample", None, None, False),
        ("sample", 2048, None, False),
        ("update", None, 1024, False),
        ("update", None, 1024, True),
        ("update", None, 4096, False),
        ("update", None, 4096, True),
    ]


def test_options_select_cases(probe):
    args = probe.parse_args(["--cases", "update", "--update-tokens", "512", "--prefill-budget", "64"])
    assert [(c["kind"], c["tokens"]) for c in probe.cases(args)] == [("update", 512), ("update", 512)]
    args = probe.parse_args(["--cases", "sample", "--prefill-budget", "64", "512"])
    assert [c["prefill_budget"] for c in probe.cases(args)] == [None, 64, 512]


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["--rows", "0"], "--rows must be >= 1"),
        (["--rows", "5", "--num-samples", "2"], "must be a multiple of --num-samples"),
        (["--update-tokens", "1024", "0"], "--update-tokens must all be >= 1"),
        (["--prefill-budget", "2048", "0"], "--prefill-budget must all be >= 1"),
        (["--update-repeats", "0"], "--update-repeats must be >= 1"),
        (["--allocators", "mimalloc"], "invalid choice: 'mimalloc'"),
    ],
)
def test_bad_options_are_refused_with_the_option_named(probe, argv, message, capsys):
    with pytest.raises(SystemExit):
        probe.parse_args(argv)
    assert message in capsys.readouterr().err


def test_a_child_reports_its_peak_above_the_team(probe):
    args = probe.parse_args(["--model", "tiny-random", "--rows", "4", "--prompt-tokens", "12", "--new-tokens", "4"])
    sample = probe.child(
        args, {"kind": "sample", "prefill_budget": 16, "gradient_checkpointing": False, "allocator": "glibc"}
    )
    update = probe.child(args, {"kind": "update", "tokens": 64, "gradient_checkpointing": True, "allocator": "glibc"})
    assert update["last_pass_seconds"] > 0 and sample["last_pass_seconds"] is None
    for result in (sample, update):
        assert result["team_gib"] > 0 and result["peak_gib"] >= result["team_gib"] - 1e-6
        assert result["peak_above_team_gib"] is None or result["peak_above_team_gib"] >= 0
    label = probe._label(update, args)
    assert label.startswith("update 64 tokens x 3 passes, gradient checkpointing on, last pass ") and label.endswith(
        " s"
    )


def test_every_case_runs_under_each_allocator_asked_for(probe):
    args = probe.parse_args(["--cases", "update", "--update-tokens", "64", "--allocators", "glibc", "tcmalloc"])
    assert [(c["allocator"], c["gradient_checkpointing"]) for c in probe.cases(args)] == [
        ("glibc", False),
        ("glibc", True),
        ("tcmalloc", False),
        ("tcmalloc", True),
    ]


def test_a_case_asked_for_on_tcmalloc_runs_on_tcmalloc(probe):
    from comlrl_core.models.cpu.allocator import find_library

    if find_library("tcmalloc") is None:
        pytest.skip("no tcmalloc on this machine (scripts/setup.sh installs it where apt can)")
    argv = ["--model", "tiny-random", "--update-seq", "16", "--update-repeats", "2", "--allocators", "tcmalloc"]
    args = probe.parse_args(argv)
    result = probe.run_case(
        args, {"kind": "update", "tokens": 32, "gradient_checkpointing": False, "allocator": "tcmalloc"}
    )
    assert result["allocator"] == "tcmalloc" and result["peak_gib"] > 0
