"""Config dataclasses: typed, validated, loadable from YAML and ``key=value`` overrides.

A learner config is a ``@dataclass`` subclass of :class:`BaseConfig`::

    @dataclass
    class MAGRPOConfig(BaseConfig):
        num_generations: int = option(4, help="completions sampled per prompt and agent")
        comparator_policy: Literal["model", "random"] = option("model", help="...")

        def validate(self) -> None:
            super().validate()
            check_positive("num_generations", self.num_generations)

    cfg = MAGRPOConfig.from_yaml("magrpo.yaml", overrides=["comparator_policy=random"])

Every construction (plain call, ``from_dict``, YAML, overrides) checks each field
against its annotation, then runs :meth:`BaseConfig.validate`. Errors are
:class:`ConfigError` (a ``ValueError``) naming the option, what is allowed and the
value given. Override text is parsed by type: see :mod:`comlrl_core.config.coercion`.
"""

from __future__ import annotations

import copy
import dataclasses
import difflib
import enum
import math
import pathlib
import typing
from typing import Any, Iterable, Mapping, Sequence, TypeVar

import yaml

from comlrl_core.config.coercion import (
    ConfigError,
    YamlDumper,
    YamlLoader,
    build_dataclass,
    coerce,
    field_types,
    parse_text,
    render_text,
    type_name,
    unknown_option,
)

__all__ = [
    "BaseConfig",
    "ConfigError",
    "build_dataclass",
    "check_in",
    "check_positive",
    "check_range",
    "describe_options",
    "field_types",
    "option",
    "parse_overrides",
]

C = TypeVar("C", bound="BaseConfig")


def option(default: Any = dataclasses.MISSING, *, help: str = "", **field_kwargs: Any) -> Any:
    """``dataclasses.field`` with a ``help`` text (shown by :func:`describe_options`).

    A mutable default (list, dict, set, dataclass instance) is copied per instance.
    """
    metadata = dict(field_kwargs.pop("metadata", {}) or {})
    metadata["help"] = help
    if isinstance(default, (list, dict, set)) or dataclasses.is_dataclass(default):
        template = default
        return dataclasses.field(default_factory=lambda: _copy_default(template), metadata=metadata, **field_kwargs)
    return dataclasses.field(default=default, metadata=metadata, **field_kwargs)


def _copy_default(value: Any) -> Any:
    return copy.deepcopy(value)


def parse_overrides(overrides: Sequence[str] | str) -> list[tuple[list[str], str]]:
    """``["a.b=1", "c=x"]`` -> ``[(["a", "b"], "1"), (["c"], "x")]``; a leading ``--`` is allowed."""
    if isinstance(overrides, str):
        raise ConfigError(f"overrides must be a list of 'key=value' strings, got the string {overrides!r}")
    parsed = []
    for item in overrides:
        if not isinstance(item, str) or "=" not in item:
            raise ConfigError(f"override {item!r} must look like key=value (e.g. num_generations=8)")
        key, value = item.split("=", 1)
        key = key.strip()
        key = key[2:] if key.startswith("--") else key
        path = key.split(".")
        if not key or any(not part for part in path):
            raise ConfigError(f"override {item!r} has an empty option name")
        parsed.append((path, value))
    return parsed


def apply_overrides(cls: type, data: dict[str, Any], overrides: Sequence[str]) -> dict[str, Any]:
    """Set typed override values into ``data`` (raw options of ``cls``), dotted keys into nested groups."""
    for path, text in parse_overrides(overrides):
        target, container = cls, data
        for depth, key in enumerate(path):
            dotted = ".".join(path[: depth + 1])
            hints = field_types(target)
            if key not in hints:
                error = unknown_option(key, target, hints)
                raise error.nested_in(".".join(path[:depth])) if depth else error
            hint = hints[key]
            if depth == len(path) - 1:
                container[key] = parse_text(text, hint, dotted)
                break
            nested = _dataclass_in(hint)
            if nested is None:
                raise ConfigError(
                    f"option '{dotted}' is {type_name(hint)}, not a group of options; write {dotted}=<value>",
                    dotted,
                )
            current = container.get(key)
            if dataclasses.is_dataclass(current) and not isinstance(current, type):
                current = _shallow_dict(current)
            elif isinstance(current, Mapping):
                current = dict(current)
            else:  # unset / None: start from the group's defaults
                current = {}
            container[key] = current
            target, container = nested, current
    return data


def _dataclass_in(hint: Any) -> type | None:
    """The dataclass inside ``hint`` (``Nested`` or ``Optional[Nested]``), if any."""
    candidates = typing.get_args(hint) if typing.get_origin(hint) is not None else (hint,)
    for tp in candidates:
        if isinstance(tp, type) and dataclasses.is_dataclass(tp):
            return tp
    return None


def _shallow_dict(obj: Any) -> dict[str, Any]:
    return {f.name: getattr(obj, f.name) for f in dataclasses.fields(obj) if f.init}


def _plain(value: Any) -> Any:
    """YAML/JSON-friendly form of a config value."""
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return {f.name: _plain(getattr(value, f.name)) for f in dataclasses.fields(value) if f.init}
    if isinstance(value, enum.Enum):
        return _plain(value.value)
    if isinstance(value, pathlib.PurePath):
        return str(value)
    if isinstance(value, (list, tuple, set, frozenset)):
        return [_plain(v) for v in value]
    if isinstance(value, Mapping):
        return {_plain(k): _plain(v) for k, v in value.items()}
    if value is None or isinstance(value, (bool, int, float, str)):
        return value
    if callable(value):  # e.g. a custom transition function: recorded by name only
        return f"<callable {getattr(value, '__module__', '?')}.{getattr(value, '__qualname__', '?')}>"
    return repr(value)


@dataclasses.dataclass
class BaseConfig:
    """Base of every config dataclass. Subclasses extend :meth:`validate`.

    Construction checks each field against its annotation, then calls ``validate()``.
    A subclass that needs its own ``__post_init__`` must call ``super().__post_init__()``.
    Values derived from other options belong in ``field(init=False)`` fields, so that
    ``with_overrides`` recomputes them. Frozen subclasses are not supported
    (dataclasses forbid a frozen class on a non-frozen base).
    """

    def __post_init__(self) -> None:
        hints = field_types(type(self))
        for name, hint in hints.items():
            value = coerce(getattr(self, name), hint, name)
            setattr(self, name, value)
        self.validate()

    def validate(self) -> None:
        """Cross-field and range checks; overrides must call ``super().validate()``."""

    # -- construction ------------------------------------------------------------------
    @classmethod
    def from_dict(cls: type[C], data: Mapping[str, Any]) -> C:
        """Build from a (nested) mapping; unknown keys and wrong types raise ConfigError."""
        return build_dataclass(cls, data)

    @classmethod
    def from_yaml(cls: type[C], path: str | pathlib.Path, overrides: Sequence[str] = ()) -> C:
        """Load a YAML mapping of options, then apply ``key=value`` overrides."""
        path = pathlib.Path(path)
        try:
            with path.open("r", encoding="utf-8") as handle:
                data = yaml.load(handle, Loader=YamlLoader)  # noqa: S506 - SafeLoader subclass
        except yaml.YAMLError as err:
            raise ConfigError(f"{path}: not valid YAML: {err}") from None
        if data is None:
            data = {}
        if not isinstance(data, dict):
            raise ConfigError(f"{path}: expected a mapping of options, got {type(data).__name__}")
        return cls.from_dict(apply_overrides(cls, data, overrides))

    def with_overrides(self: C, overrides: Sequence[str]) -> C:
        """A copy with ``key=value`` overrides applied (all at once, then validated)."""
        cls = type(self)
        return cls.from_dict(apply_overrides(cls, _shallow_dict(self), overrides))

    # -- export ------------------------------------------------------------------------
    def to_dict(self) -> dict[str, Any]:
        """Plain nested dict (lists, str paths, enum values) that ``from_dict`` reads back."""
        return _plain(self)

    def to_yaml(self, path: str | pathlib.Path) -> pathlib.Path:
        path = pathlib.Path(path)
        path.parent.mkdir(parents=True, exist_ok=True)
        # allow_unicode=False: PyYAML mis-writes some line-break characters (e.g. U+0085) raw.
        text = yaml.dump(self.to_dict(), Dumper=YamlDumper, sort_keys=False, allow_unicode=False, width=math.inf)
        path.write_text(text, encoding="utf-8")
        return path

    def to_overrides(self) -> list[str]:
        """``key=value`` strings that rebuild this config from the defaults (nested keys dotted)."""
        out: list[str] = []
        _collect_overrides(self, "", out)
        return out


def _collect_overrides(obj: Any, prefix: str, out: list[str]) -> None:
    for name, hint in field_types(type(obj)).items():
        value = getattr(obj, name)
        if dataclasses.is_dataclass(value) and not isinstance(value, type):
            _collect_overrides(value, f"{prefix}{name}.", out)
        else:
            out.append(f"{prefix}{name}={render_text(value, hint)}")


# -- helpers for validate() ---------------------------------------------------------------


def check_positive(name: str, value: float, *, allow_zero: bool = False) -> None:
    """Raise unless ``value > 0`` (``>= 0`` with ``allow_zero``)."""
    ok = value >= 0 if allow_zero else value > 0
    if not ok or (isinstance(value, float) and math.isnan(value)):
        bound = ">= 0" if allow_zero else "> 0"
        raise ConfigError(f"option '{name}' must be {bound}, got {value!r}; set {name} to a value {bound}", name)


def check_in(name: str, value: Any, allowed: Iterable[Any]) -> None:
    """Raise unless ``value`` is one of ``allowed``."""
    allowed = list(allowed)
    if value not in allowed:
        choices = ", ".join(repr(a) for a in allowed)
        close = difflib.get_close_matches(str(value), [str(a) for a in allowed], n=1)
        hint = f"; did you mean {close[0]!r}?" if close else ""
        raise ConfigError(f"option '{name}' must be one of {choices}; got {value!r}{hint}", name)


def check_range(
    name: str,
    value: float,
    low: float | None = None,
    high: float | None = None,
    *,
    low_inclusive: bool = True,
    high_inclusive: bool = True,
) -> None:
    """Raise unless ``low <= value <= high`` (bounds optional, inclusivity configurable)."""
    too_low = low is not None and (value < low if low_inclusive else value <= low)
    too_high = high is not None and (value > high if high_inclusive else value >= high)
    if too_low or too_high or (isinstance(value, float) and math.isnan(value)):
        left = "" if low is None else ("[" if low_inclusive else "(") + repr(low)
        right = "" if high is None else repr(high) + ("]" if high_inclusive else ")")
        span = f"{left or '(-inf'}, {right or 'inf)'}"
        raise ConfigError(f"option '{name}' must be in {span}, got {value!r}; pick a value in that range", name)


# -- documentation ------------------------------------------------------------------------


def describe_options(cls: type) -> list[dict[str, Any]]:
    """One row per option: ``name``, ``type``, ``default``, ``required``, ``help``.

    Options of nested config groups follow their group, with dotted names.
    """
    rows: list[dict[str, Any]] = []
    _describe(cls, "", rows)
    return rows


def _describe(cls: type, prefix: str, rows: list[dict[str, Any]]) -> None:
    hints = field_types(cls)
    for f in dataclasses.fields(cls):
        if not f.init:
            continue
        if f.default is not dataclasses.MISSING:
            default, required = f.default, False
        elif f.default_factory is not dataclasses.MISSING:
            default, required = f.default_factory(), False
        else:
            default, required = None, True
        hint = hints[f.name]
        rows.append(
            {
                "name": prefix + f.name,
                "type": type_name(hint),
                "default": _plain(default),
                "required": required,
                "help": f.metadata.get("help", ""),
            }
        )
        nested = _dataclass_in(hint)
        if nested is not None:
            _describe(nested, f"{prefix}{f.name}.", rows)
