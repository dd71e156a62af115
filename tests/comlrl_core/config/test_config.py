"""Configs: typed construction, YAML, key=value overrides, clear errors, option docs."""

from __future__ import annotations

import enum
import math
import pathlib
import tempfile
from dataclasses import dataclass
from typing import Any, Literal, Optional

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from comlrl_core.config.options import (
    BaseConfig,
    ConfigError,
    check_in,
    check_positive,
    check_range,
    describe_options,
    option,
)


class Mode(enum.Enum):
    PLAIN = "plain"
    FEEDBACK = "level_feedback"


@dataclass
class ModelConfig(BaseConfig):
    name: str = option("tiny-gpt2", help="model id, folder or alias")
    lora_r: int = option(8, help="LoRA rank")
    dtype: Optional[str] = None

    def validate(self) -> None:
        super().validate()
        check_positive("lora_r", self.lora_r)


@dataclass
class MAGRPOConfig(BaseConfig):
    learning_rate: float = option(1e-5, help="optimizer step size")
    num_generations: int = option(4, help="completions per prompt and agent")
    num_turns: int = 1
    comparator_policy: Literal["model", "random", "oracle"] = "model"
    early_termination_threshold: Optional[float] = None
    discount: float = 0.9
    use_lora: bool = True
    stop_words: list[str] = option(["</code>"])
    betas: tuple[float, float] = (0.9, 0.999)
    reward_weights: dict[str, float] = option({"tests": 1.0})
    seed: Optional[int] = None
    output_dir: pathlib.Path = pathlib.Path("runs")
    mode: Mode = Mode.PLAIN
    extra: Any = None
    model: ModelConfig = option(ModelConfig(), help="the policy model")

    def validate(self) -> None:
        super().validate()
        check_positive("num_generations", self.num_generations)
        check_range("discount", self.discount, 0.0, 1.0)
        if self.num_turns > 1 and self.early_termination_threshold is None:
            pass  # allowed: run all turns


@dataclass
class NeedsName(BaseConfig):
    run_name: str
    steps: int = 10


# -- construction and type checking ---------------------------------------------------------


def test_defaults_and_lossless_conversions() -> None:
    cfg = MAGRPOConfig(learning_rate=1, betas=[0.5, 0.6], output_dir="out", model={"lora_r": 4})
    assert cfg.learning_rate == 1.0 and isinstance(cfg.learning_rate, float)
    assert cfg.betas == (0.5, 0.6)
    assert cfg.output_dir == pathlib.Path("out")
    assert cfg.model == ModelConfig(lora_r=4)
    assert MAGRPOConfig().stop_words is not MAGRPOConfig().stop_words  # mutable default copied


@pytest.mark.parametrize(
    "kwargs, message",
    [
        ({"num_generations": "4"}, r"option 'num_generations' expects int, got str '4'"),
        ({"num_generations": 4.0}, r"option 'num_generations' expects int, got float 4.0"),
        ({"learning_rate": True}, r"option 'learning_rate' expects float, got bool True"),
        ({"use_lora": 1}, r"option 'use_lora' expects bool, got int 1"),
        ({"comparator_policy": "modle"}, r"must be one of 'model', 'random', 'oracle'; got 'modle'"),
        ({"stop_words": "abc"}, r"option 'stop_words' expects list\[str\], got str"),
        ({"stop_words": ["a", 3]}, r"option 'stop_words\[1\]' expects str, got int 3"),
        ({"betas": [0.9]}, r"option 'betas' expects 2 items"),
        ({"reward_weights": {"tests": "high"}}, r"option 'reward_weights.tests' expects float"),
        ({"mode": "fancy"}, r"option 'mode' must be one of 'plain', 'level_feedback'; got 'fancy'"),
        ({"model": {"lora_r": "8"}}, r"option 'model.lora_r' expects int, got str '8'"),
        ({"model": {"lora_r": 0}}, r"option 'model.lora_r' must be > 0, got 0"),
        ({"seed": "x"}, r"option 'seed' expects int, got str 'x' \(or None\)"),
        ({"num_generations": 0}, r"option 'num_generations' must be > 0, got 0; set num_generations"),
        ({"discount": 1.5}, r"option 'discount' must be in \[0.0, 1.0\], got 1.5"),
    ],
)
def test_wrong_values_name_option_expectation_and_value(kwargs: dict, message: str) -> None:
    with pytest.raises(ConfigError, match=message) as info:
        MAGRPOConfig.from_dict(kwargs)
    assert isinstance(info.value, ValueError)
    assert info.value.option == next(iter(kwargs)) or info.value.option.startswith(next(iter(kwargs)))


def test_unknown_option_suggests_and_lists_allowed() -> None:
    with pytest.raises(ConfigError) as info:
        MAGRPOConfig.from_dict({"lerning_rate": 1e-4})
    text = str(info.value)
    assert text.startswith("unknown option 'lerning_rate' for MAGRPOConfig; did you mean 'learning_rate'?")
    assert "allowed: betas, comparator_policy, discount," in text
    with pytest.raises(ConfigError, match=r"unknown option 'model.lora_rank' for ModelConfig; did you mean 'lora_r'"):
        MAGRPOConfig.from_dict({"model": {"lora_rank": 4}})
    with pytest.raises(ConfigError, match=r"unknown option 'zzz' for MAGRPOConfig; allowed: "):
        MAGRPOConfig.from_dict({"zzz": 1})


def test_missing_required_option() -> None:
    with pytest.raises(ConfigError, match=r"NeedsName: missing required option\(s\) run_name"):
        NeedsName.from_dict({"steps": 3})
    assert NeedsName.from_dict({"run_name": "a"}).steps == 10


# -- overrides --------------------------------------------------------------------------------


def test_overrides_parse_by_type() -> None:
    cfg = MAGRPOConfig().with_overrides(
        [
            "comparator_policy=random",
            "learning_rate=3e-4",
            "num_generations=1e1",
            "use_lora=no",
            "early_termination_threshold=0.75",
            "seed=null",
            "stop_words=a, b ,c",
            "betas=[0.8, 0.95]",
            "reward_weights={tests: 2, style: 1e-3}",
            "output_dir=/tmp/x",
            "mode=level_feedback",
            "extra={k: [1, 2]}",
            "--model.lora_r=16",
            "model.dtype=bfloat16",
        ]
    )
    assert cfg.comparator_policy == "random"
    assert cfg.learning_rate == 3e-4
    assert cfg.num_generations == 10
    assert cfg.use_lora is False
    assert cfg.early_termination_threshold == 0.75
    assert cfg.seed is None
    assert cfg.stop_words == ["a", "b", "c"]
    assert cfg.betas == (0.8, 0.95)
    assert cfg.reward_weights == {"tests": 2.0, "style": 1e-3}
    assert cfg.output_dir == pathlib.Path("/tmp/x")
    assert cfg.mode is Mode.FEEDBACK
    assert cfg.extra == {"k": [1, 2]}
    assert cfg.model == ModelConfig(lora_r=16, dtype="bfloat16")


@pytest.mark.parametrize(
    "text, expected",
    [("true", True), ("False", False), ("1", True), ("0", False), ("yes", True), ("NO", False)],
)
def test_bool_words(text: str, expected: bool) -> None:
    assert MAGRPOConfig().with_overrides([f"use_lora={text}"]).use_lora is expected


def test_override_edge_cases() -> None:
    base = MAGRPOConfig()
    assert base.with_overrides(["stop_words="]).stop_words == []
    assert base.with_overrides(["stop_words=[]"]).stop_words == []
    assert base.with_overrides(["stop_words=['a,b', c]"]).stop_words == ["a,b", "c"]
    assert base.with_overrides(["model.dtype='none'"]).model.dtype == "none"  # quoted: literal text
    assert base.with_overrides(["model.dtype=none"]).model.dtype is None
    assert base.with_overrides(["model.name=a=b"]).model.name == "a=b"  # split at the first '='
    assert base.with_overrides(["discount=.5"]).discount == 0.5
    assert math.isinf(base.with_overrides(["early_termination_threshold=inf"]).early_termination_threshold)
    # all overrides are applied before validation: order inside the list does not matter
    assert base.with_overrides(["num_generations=2", "num_generations=3"]).num_generations == 3
    # a whole group, then one of its fields
    cfg = base.with_overrides(["model={name: m, lora_r: 2}", "model.lora_r=5"])
    assert cfg.model == ModelConfig(name="m", lora_r=5)
    assert base.with_overrides([]) == base


@pytest.mark.parametrize(
    "override, message",
    [
        ("lerning_rate=1", r"unknown option 'lerning_rate' for MAGRPOConfig; did you mean 'learning_rate'"),
        ("comparator_policy=modle", r"must be one of 'model', 'random', 'oracle'; got 'modle'"),
        ("num_generations=four", r"option 'num_generations' expects int, got 'four'"),
        ("num_generations=2.5", r"option 'num_generations' expects int, got '2.5'"),
        ("use_lora=maybe", r"option 'use_lora' expects bool \(true/false, 1/0, yes/no\), got 'maybe'"),
        ("learning_rate=fast", r"option 'learning_rate' expects float \(e.g. 0.5, 1e-5\), got 'fast'"),
        ("seed=x", r"option 'seed' expects int \| None \(write none for None\), got 'x'"),
        ("betas=1,2,3", r"option 'betas' expects 2 items"),
        ("betas=[1, 2", r"option 'betas' expects tuple\[float, float\]; cannot read"),
        ("reward_weights=tests", r"option 'reward_weights' expects dict\[str, float\] as a YAML mapping"),
        ("model.lora_rr=3", r"unknown option 'model.lora_rr' for ModelConfig; did you mean 'lora_r'"),
        ("model.lora_r=0", r"option 'model.lora_r' must be > 0, got 0"),
        ("discount.x=1", r"option 'discount' is float, not a group of options"),
        ("discount=2", r"option 'discount' must be in \[0.0, 1.0\], got 2.0"),
        ("discount", r"override 'discount' must look like key=value"),
        ("=3", r"override '=3' has an empty option name"),
    ],
)
def test_bad_overrides(override: str, message: str) -> None:
    with pytest.raises(ConfigError, match=message):
        MAGRPOConfig().with_overrides([override])


def test_overrides_must_be_a_list() -> None:
    with pytest.raises(ConfigError, match="must be a list"):
        MAGRPOConfig().with_overrides("num_turns=2")  # type: ignore[arg-type]


# -- YAML -------------------------------------------------------------------------------------


def test_yaml_round_trip_and_overrides(tmp_path: pathlib.Path) -> None:
    path = tmp_path / "magrpo.yaml"
    path.write_text(
        "learning_rate: 1e-5\n"  # PyYAML alone would read this as a string
        "num_generations: 6\n"
        "comparator_policy: oracle\n"
        "stop_words: [x, y]\n"
        "model:\n  name: m\n  lora_r: 4\n"
    )
    cfg = MAGRPOConfig.from_yaml(path, overrides=["comparator_policy=model", "model.lora_r=2"])
    assert cfg.learning_rate == 1e-5
    assert cfg.num_generations == 6
    assert cfg.comparator_policy == "model"
    assert cfg.stop_words == ["x", "y"]
    assert cfg.model == ModelConfig(name="m", lora_r=2)
    out = cfg.to_yaml(tmp_path / "saved" / "cfg.yaml")
    assert MAGRPOConfig.from_yaml(out) == cfg
    assert NeedsName.from_yaml(_write(tmp_path / "n.yaml", ""), overrides=["run_name=r"]) == NeedsName("r")


def _write(path: pathlib.Path, text: str) -> pathlib.Path:
    path.write_text(text)
    return path


@pytest.mark.parametrize(
    "text, message",
    [
        ("num_generations: four\n", r"option 'num_generations' expects int, got str 'four'"),
        ("num_generations: '4'\n", r"option 'num_generations' expects int, got str '4'"),
        ("model: {lora_r: 1.5}\n", r"option 'model.lora_r' expects int, got float 1.5"),
        ("num_generatons: 4\n", r"did you mean 'num_generations'"),
        ("- a\n- b\n", r"expected a mapping of options, got list"),
        ("a: [1\n", r"not valid YAML"),
    ],
)
def test_bad_yaml(tmp_path: pathlib.Path, text: str, message: str) -> None:
    with pytest.raises(ConfigError, match=message):
        MAGRPOConfig.from_yaml(_write(tmp_path / "c.yaml", text))


def test_to_dict_is_plain_and_reads_back() -> None:
    cfg = MAGRPOConfig(mode=Mode.FEEDBACK, output_dir=pathlib.Path("o"))
    data = cfg.to_dict()
    assert data["betas"] == [0.9, 0.999] and data["mode"] == "level_feedback" and data["output_dir"] == "o"
    assert data["model"] == {"name": "tiny-gpt2", "lora_r": 8, "dtype": None}
    assert MAGRPOConfig.from_dict(data) == cfg


# -- helpers and docs -------------------------------------------------------------------------


def test_check_helpers() -> None:
    check_positive("n", 1)
    check_positive("n", 0, allow_zero=True)
    with pytest.raises(ConfigError, match=r"option 'n' must be >= 0, got -1"):
        check_positive("n", -1, allow_zero=True)
    with pytest.raises(ConfigError, match=r"option 'x' must be > 0, got nan"):
        check_positive("x", float("nan"))
    check_in("joint_mode", "cross", ["cross", "aligned"])
    with pytest.raises(ConfigError, match=r"must be one of 'cross', 'aligned'; got 'crosss'; did you mean 'cross'"):
        check_in("joint_mode", "crosss", ["cross", "aligned"])
    check_range("p", 1.0, 0.0, 1.0)
    with pytest.raises(ConfigError, match=r"option 'p' must be in \(0.0, 1.0\], got 0.0"):
        check_range("p", 0.0, 0.0, 1.0, low_inclusive=False)
    with pytest.raises(ConfigError, match=r"option 'k' must be in \[2, inf\), got 1"):
        check_range("k", 1, low=2)


def test_describe_options() -> None:
    rows = {row["name"]: row for row in describe_options(MAGRPOConfig)}
    assert rows["learning_rate"] == {
        "name": "learning_rate",
        "type": "float",
        "default": 1e-5,
        "required": False,
        "help": "optimizer step size",
    }
    assert rows["comparator_policy"]["type"] == "one of 'model', 'random', 'oracle'"
    assert rows["seed"]["type"] == "int | None"
    assert rows["stop_words"]["default"] == ["</code>"]
    assert rows["model.lora_r"]["help"] == "LoRA rank"
    assert rows["model"]["type"] == "ModelConfig"
    assert describe_options(NeedsName)[0] == {
        "name": "run_name",
        "type": "str",
        "default": None,
        "required": True,
        "help": "",
    }


# -- hypothesis: overrides written by to_overrides() read back exactly ------------------------

_text = st.text(st.characters(blacklist_categories=("Cs",)), max_size=12)


@st.composite
def configs(draw) -> MAGRPOConfig:
    return MAGRPOConfig(
        learning_rate=draw(st.floats(allow_nan=False, width=64)),
        num_generations=draw(st.integers(1, 10**12)),
        num_turns=draw(st.integers(-5, 5)),
        comparator_policy=draw(st.sampled_from(["model", "random", "oracle"])),
        early_termination_threshold=draw(st.none() | st.floats(allow_nan=False)),
        discount=draw(st.floats(0.0, 1.0)),
        use_lora=draw(st.booleans()),
        stop_words=draw(st.lists(_text, max_size=4)),
        betas=draw(st.tuples(st.floats(allow_nan=False), st.floats(allow_nan=False))),
        reward_weights=draw(st.dictionaries(_text, st.floats(allow_nan=False), max_size=3)),
        seed=draw(st.none() | st.integers()),
        mode=draw(st.sampled_from(list(Mode))),
        extra=draw(st.none() | st.booleans() | st.integers() | _text | st.lists(st.integers(), max_size=3)),
        model=ModelConfig(
            name=draw(_text),
            lora_r=draw(st.integers(1, 512)),
            dtype=draw(st.none() | _text),
        ),
    )


@settings(max_examples=150, deadline=None)
@given(cfg=configs())
def test_to_overrides_round_trip(cfg: MAGRPOConfig) -> None:
    assert MAGRPOConfig().with_overrides(cfg.to_overrides()) == cfg


@settings(max_examples=60, deadline=None)
@given(cfg=configs())
def test_yaml_round_trip_property(cfg: MAGRPOConfig) -> None:
    with tempfile.TemporaryDirectory() as folder:
        path = cfg.to_yaml(pathlib.Path(folder) / "cfg.yaml")
        assert MAGRPOConfig.from_yaml(path) == cfg


@settings(max_examples=100, deadline=None)
@given(value=st.floats(allow_nan=False), count=st.integers())
def test_number_override_round_trip(value: float, count: int) -> None:
    cfg = MAGRPOConfig().with_overrides([f"learning_rate={value!r}", f"seed={count}"])
    assert cfg.learning_rate == value and cfg.seed == count


@pytest.mark.parametrize("key", ["0E0", "1e-5", "-3E4", "7"])
def test_yaml_keeps_strings_that_read_like_numbers(key: str, tmp_path: pathlib.Path) -> None:
    # found by the round-trip property: a bare "0E0" came back as the float 0.0
    cfg = MAGRPOConfig(reward_weights={key: 1.0})
    path = cfg.to_yaml(tmp_path / "cfg.yaml")
    assert MAGRPOConfig.from_yaml(path).reward_weights == {key: 1.0}


def test_a_list_of_strings_with_line_breaks_is_one_override_line() -> None:
    cfg = MAGRPOConfig(stop_words=["\n```\n", "a\tb"])
    (line,) = [o for o in cfg.to_overrides() if o.startswith("stop_words=")]
    assert "\n" not in line  # one line: `--print-config` output can be pasted back
    assert MAGRPOConfig().with_overrides([line]).stop_words == ["\n```\n", "a\tb"]
