"""The user guide stays true: its worked example runs, its option reference is current,
and the index links every page."""

from __future__ import annotations

import os
import pathlib
import re
import subprocess
import sys

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[1]
DOCS = ROOT / "docs"


def python_blocks(page: pathlib.Path) -> list[str]:
    return re.findall(r"```python\n(.*?)```", page.read_text(encoding="utf-8"), flags=re.S)


def test_custom_env_example_runs(tmp_path, monkeypatch, capsys):
    blocks = python_blocks(DOCS / "custom_env.md")
    assert len(blocks) >= 4
    monkeypatch.chdir(tmp_path)  # the training block writes runs/ here
    namespace: dict = {"__name__": "docs_custom_env"}
    for block in blocks:
        exec(compile(block, str(DOCS / "custom_env.md"), "exec"), namespace)  # noqa: S102 - our own docs
    # What the page claims actually happened.
    assert "Write a two-line poem about: river" in capsys.readouterr().out
    assert namespace["result"]["pass@1"] == 1.0
    trainer = namespace["trainer"]
    assert trainer.global_step == 2
    assert (tmp_path / "runs" / "topic_magrpo" / "metrics.jsonl").exists()


def test_option_reference_is_current():
    proc = subprocess.run(
        [sys.executable, str(ROOT / "scripts" / "gen_option_reference.py"), "--check"],
        capture_output=True,
        text=True,
        cwd=ROOT,
        env={**os.environ, "PYTHONPATH": str(ROOT)},
    )
    assert proc.returncode == 0, proc.stderr


def test_option_reference_lists_every_option():
    from comlrl_core.config.options import describe_options
    from learners.magrpo import MAGRPOConfig

    text = (DOCS / "options.md").read_text(encoding="utf-8")
    for row in describe_options(MAGRPOConfig):
        assert f"| `{row['name']}` |" in text


def test_index_links_every_page():
    index = (DOCS / "index.md").read_text(encoding="utf-8")
    linked = set(re.findall(r"\]\(([\w\-]+\.md)(?:#[\w\-]*)?\)", index))
    pages = {p.name for p in DOCS.glob("*.md")} - {"index.md"}
    assert pages <= linked, f"not linked from docs/index.md: {sorted(pages - linked)}"
    assert linked <= pages | {"index.md"}, f"broken links: {sorted(linked - pages)}"


@pytest.mark.parametrize("page", sorted(p.name for p in DOCS.glob("*.md")))
def test_relative_links_resolve(page):
    text = re.sub(r"```.*?```", "", (DOCS / page).read_text(encoding="utf-8"), flags=re.S)  # code is not links
    for target in re.findall(r"\]\((?!https?://|#)([^)#\s]+)", text):
        assert (DOCS / target).exists(), f"{page} links to missing {target}"


def test_install_section_covers_library_use():
    for page in (ROOT / "README.md", DOCS / "index.md"):
        text = page.read_text(encoding="utf-8")
        assert "## Install" in text, page
        assert "pip install" in text and "download.pytorch.org/whl/" in text, page  # extras, GPU / CPU torch
        assert "COMLRL_SKIP_DOCKER=1" in text, page


def test_evaluate_and_export_page_shows_the_commands():
    text = (DOCS / "evaluation.md").read_text(encoding="utf-8")
    assert "## Evaluate and export a trained run" in text
    for command in ("comlrl eval --checkpoint", "comlrl export", "--adapters-only", "AutoModelForCausalLM"):
        assert command in text


def test_option_name_mapping_names_real_options():
    """Every comlrl-gym name in the CoMLRL / TRL mapping table is an option of a learner config."""
    from comlrl_core.config.options import field_types
    from learners.actor_critic import MAACConfig
    from learners.madpo import MADPOConfig
    from learners.magrpo import MAGRPOConfig

    known = set().union(*(field_types(c) for c in (MAGRPOConfig, MAACConfig, MADPOConfig)))
    text = (DOCS / "comlrl_differences.md").read_text(encoding="utf-8")
    table = text.split("## Option names: CoMLRL, TRL and comlrl-gym", 1)[1]
    rows = [line for line in table.splitlines() if line.startswith("| `")]
    assert len(rows) >= 15
    names = {name for row in rows for name in re.findall(r"`(\w+)`", row.split("|")[1])}
    assert {"lr_scheduler_type", "save_total_limit", "stop", "report_to"} <= names
    assert names <= known, f"not options: {sorted(names - known)}"
