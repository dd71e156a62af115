"""Type-driven checking and parsing of config values (used by :mod:`comlrl_core.config.options`).

Two entry points, both driven by a field's type annotation:

* :func:`coerce` checks a Python value (from a constructor call, ``from_dict`` or YAML)
  against the annotation. It is strict: a string is never an int. It only makes
  lossless conversions (int -> float, list <-> tuple, mapping -> nested dataclass,
  numpy scalars -> Python numbers).
* :func:`parse_text` turns a ``key=value`` override string into a typed value. This is
  where ``"true"``, ``"1e-5"``, ``"none"``, ``"a,b,c"`` and ``"[1, 2]"`` are understood.

Supported annotations: bool, int, float, str, pathlib.Path, Enum subclasses, Literal,
Optional / Union, list / tuple / Sequence, dict / Mapping, dataclasses (nested
configs), Callable (checked, never parsed from text) and Any; any other class is
checked with ``isinstance``.
"""

from __future__ import annotations

import collections.abc as cabc
import dataclasses
import difflib
import enum
import functools
import json
import math
import numbers
import pathlib
import re
import types
import typing
from typing import Any, Callable, Iterable, Mapping

import yaml

__all__ = [
    "ConfigError",
    "YamlDumper",
    "YamlLoader",
    "build_dataclass",
    "coerce",
    "field_types",
    "parse_text",
    "render_text",
    "type_name",
    "unknown_option",
]


class ConfigError(ValueError):
    """A bad option: unknown, wrong type or out of range. ``option`` names it (dotted)."""

    def __init__(self, message: str, option: str | None = None) -> None:
        super().__init__(message)
        self.option = option

    def nested_in(self, prefix: str) -> "ConfigError":
        """The same error seen from the enclosing config: ``'lora_r'`` -> ``'model.lora_r'``."""
        if self.option is None:
            return ConfigError(f"in '{prefix}': {self}", prefix)
        dotted = f"{prefix}.{self.option}"
        message = str(self).replace(f"'{self.option}'", f"'{dotted}'", 1)
        return ConfigError(message, dotted)


class YamlLoader(yaml.SafeLoader):
    """SafeLoader that also reads ``1e-5`` / ``3E4`` as floats.

    PyYAML follows YAML 1.1, where a float needs a dot, so ``lr: 1e-5`` would be the
    *string* "1e-5" -- a classic trap for learning rates.
    """


class YamlDumper(yaml.SafeDumper):
    """SafeDumper that quotes every string :class:`YamlLoader` would read back as a float.

    Without it a string such as ``"0E0"`` (a dict key, a run name) is written bare and comes
    back as the float 0.0.
    """


_YAML_FLOAT_PATTERN = re.compile(
    r"""^(?:[-+]?(?:[0-9][0-9_]*)\.[0-9_]*(?:[eE][-+]?[0-9]+)?
        |[-+]?(?:[0-9][0-9_]*)(?:[eE][-+]?[0-9]+)
        |\.[0-9_]+(?:[eE][-+]?[0-9]+)?
        |[-+]?\.(?:inf|Inf|INF)
        |\.(?:nan|NaN|NAN))$""",
    re.X,
)
for _yaml_class in (YamlLoader, YamlDumper):
    _yaml_class.add_implicit_resolver("tag:yaml.org,2002:float", _YAML_FLOAT_PATTERN, list("-+0123456789."))


class _Quoted(str):
    """A string the user quoted: always literal text (never ``none``, never a list)."""


class _TextLoader(yaml.BaseLoader):
    """Keeps every scalar as text (types come from the annotation), marking quoted ones."""

    def construct_scalar(self, node):
        value = super().construct_scalar(node)
        return _Quoted(value) if getattr(node, "style", None) in ("'", '"') else value


_NONE_WORDS = {"none", "null", "~"}
_TRUE_WORDS = {"true", "1", "yes", "on", "y"}
_FALSE_WORDS = {"false", "0", "no", "off", "n"}
_YAML_FLOATS = {".inf": math.inf, "+.inf": math.inf, "-.inf": -math.inf, ".nan": math.nan}


def _origin(tp: Any) -> Any:
    return typing.get_origin(tp)


def _is_union(tp: Any) -> bool:
    return _origin(tp) in (typing.Union, types.UnionType)


def _is_dataclass_type(tp: Any) -> bool:
    return isinstance(tp, type) and dataclasses.is_dataclass(tp)


def type_name(tp: Any) -> str:
    """A short readable name of an annotation, e.g. ``list[int]``, ``float | None``."""
    if tp is Any:
        return "any"
    if tp is type(None):
        return "None"
    if _is_union(tp):
        return " | ".join(type_name(a) for a in typing.get_args(tp))
    origin = _origin(tp)
    if origin is typing.Literal:
        return "one of " + ", ".join(repr(a) for a in typing.get_args(tp))
    if origin is not None:
        args = typing.get_args(tp)
        base = getattr(origin, "__name__", str(origin))
        if origin in (cabc.Callable,):
            return "callable"
        if not args:
            return base
        return f"{base}[{', '.join('...' if a is Ellipsis else type_name(a) for a in args)}]"
    if isinstance(tp, type):
        return tp.__name__
    return str(tp)


def _show(value: Any) -> str:
    text = repr(value)
    return text if len(text) <= 80 else text[:77] + "..."


def _type_error(name: str, tp: Any, value: Any) -> ConfigError:
    return ConfigError(
        f"option '{name}' expects {type_name(tp)}, got {type(value).__name__} {_show(value)}",
        name,
    )


# -- checking Python values ---------------------------------------------------------------


def coerce(value: Any, tp: Any, name: str) -> Any:
    """Check ``value`` against annotation ``tp``; return it in canonical form."""
    if tp is Any or tp is object:
        return value
    if _is_union(tp):
        members = typing.get_args(tp)
        if value is None and type(None) in members:
            return None
        errors = []
        for member in members:
            if member is type(None):
                continue
            try:
                return coerce(value, member, name)
            except ConfigError as err:
                errors.append(err)
        if len(errors) == 1:  # Optional[X]: X's message is the useful one
            raise ConfigError(f"{errors[0]} (or None)", name)
        raise _type_error(name, tp, value)
    origin = _origin(tp)
    if origin is typing.Literal:
        allowed = typing.get_args(tp)
        for option in allowed:
            if value == option and type(value) is type(option):
                return option
        raise ConfigError(
            f"option '{name}' must be one of {', '.join(repr(a) for a in allowed)}; got {_show(value)}",
            name,
        )
    if tp is bool:
        if isinstance(value, (bool,)) or type(value).__name__ == "bool_":
            return bool(value)
        raise _type_error(name, tp, value)
    if tp is int:
        if isinstance(value, numbers.Integral) and not isinstance(value, bool):
            return int(value)
        raise _type_error(name, tp, value)
    if tp is float:
        if isinstance(value, numbers.Real) and not isinstance(value, bool):
            return float(value)
        raise _type_error(name, tp, value)
    if tp is str:
        if isinstance(value, str):
            return str(value)
        raise _type_error(name, tp, value)
    if tp is pathlib.Path or (isinstance(tp, type) and issubclass(tp, pathlib.PurePath)):
        if isinstance(value, (str, pathlib.PurePath)):
            return tp(value)
        raise _type_error(name, tp, value)
    if isinstance(tp, type) and issubclass(tp, enum.Enum):
        return _coerce_enum(value, tp, name)
    if _is_dataclass_type(tp):
        if isinstance(value, tp):
            return value
        if isinstance(value, cabc.Mapping):
            return _build_dataclass(tp, value, name)
        raise _type_error(name, tp, value)
    if origin in (list, tuple, cabc.Sequence, cabc.MutableSequence, set, frozenset):
        return _coerce_sequence(value, tp, name)
    if origin in (dict, cabc.Mapping, cabc.MutableMapping) or tp in (dict, cabc.Mapping):
        return _coerce_mapping(value, tp, name)
    if tp in (list, tuple):
        return _coerce_sequence(value, tp[Any, ...] if tp is tuple else list[Any], name)
    if origin is cabc.Callable or tp is cabc.Callable or tp is Callable:
        if callable(value):
            return value
        raise _type_error(name, tp, value)
    if isinstance(tp, type):
        if isinstance(value, tp):
            return value
        raise _type_error(name, tp, value)
    return value  # an annotation we cannot check (e.g. a TypeVar): accept as given


def _coerce_enum(value: Any, tp: type[enum.Enum], name: str) -> enum.Enum:
    if isinstance(value, tp):
        return value
    for member in tp:
        if value == member.value or (isinstance(value, str) and value == member.name):
            return member
    allowed = ", ".join(repr(m.value) for m in tp)
    raise ConfigError(f"option '{name}' must be one of {allowed}; got {_show(value)}", name)


def _coerce_sequence(value: Any, tp: Any, name: str) -> Any:
    origin = _origin(tp) or tp
    if isinstance(value, (str, bytes)) or not isinstance(value, (list, tuple, set, frozenset)):
        raise _type_error(name, tp, value)
    args = typing.get_args(tp)
    items = list(value)
    if origin is tuple and args and not (len(args) == 2 and args[1] is Ellipsis):
        if len(items) != len(args):
            raise ConfigError(
                f"option '{name}' expects {len(args)} items ({type_name(tp)}), got {len(items)}: {_show(value)}",
                name,
            )
        return tuple(coerce(v, a, f"{name}[{i}]") for i, (v, a) in enumerate(zip(items, args, strict=True)))
    item_tp = args[0] if args else Any
    out = [coerce(v, item_tp, f"{name}[{i}]") for i, v in enumerate(items)]
    if origin is tuple:
        return tuple(out)
    if origin in (set, frozenset):
        return origin(out)
    return out


def _coerce_mapping(value: Any, tp: Any, name: str) -> dict:
    if not isinstance(value, cabc.Mapping):
        raise _type_error(name, tp, value)
    args = typing.get_args(tp)
    key_tp, val_tp = args if len(args) == 2 else (Any, Any)
    return {coerce(k, key_tp, f"{name}.<key>"): coerce(v, val_tp, f"{name}.{k}") for k, v in value.items()}


def _build_dataclass(tp: type, mapping: cabc.Mapping, name: str) -> Any:
    from_dict = getattr(tp, "from_dict", None)
    try:
        if from_dict is not None:
            return from_dict(mapping)
        return build_dataclass(tp, mapping)
    except ConfigError as err:
        raise err.nested_in(name) from None


# -- parsing override text ----------------------------------------------------------------


def _unquote(text: str) -> str:
    """``'abc'`` / ``"abc"`` -> literal ``abc`` (one level; shells usually strip them first)."""
    if isinstance(text, _Quoted):
        return text
    if len(text) >= 2 and text[0] == text[-1] and text[0] in "'\"":
        return _Quoted(text[1:-1])
    return text


def _load_text_yaml(text: str, tp: Any, name: str) -> Any:
    try:
        return yaml.load(text, Loader=_TextLoader)  # noqa: S506 - BaseLoader subclass, no objects
    except yaml.YAMLError as err:
        problem = getattr(err, "problem", None) or err
        raise ConfigError(
            f"option '{name}' expects {type_name(tp)}; cannot read {text!r} as YAML ({problem})", name
        ) from None


def parse_text(text: Any, tp: Any, name: str) -> Any:
    """Parse override text (or text nested inside a YAML flow value) for annotation ``tp``."""
    if isinstance(text, (list, dict)):  # structure from a YAML flow value; leaves are text
        return _parse_structure(text, tp, name)
    if text is None:
        return coerce(None, tp, name)
    text = _unquote(str(text) if not isinstance(text, str) else text)
    quoted = isinstance(text, _Quoted)
    if tp is Any or tp is object:
        if quoted:
            return str(text)
        if text.strip().lower() in _NONE_WORDS:
            return None
        try:
            return yaml.load(text, Loader=YamlLoader)  # noqa: S506 - SafeLoader subclass
        except yaml.YAMLError:
            return str(text)  # not YAML: the text itself
    if _is_union(tp):
        members = typing.get_args(tp)
        if not quoted and type(None) in members and text.strip().lower() in _NONE_WORDS:
            return None
        for member in members:
            if member is type(None):
                continue
            try:
                return parse_text(text, member, name)
            except ConfigError:
                continue
        extra = " (write none for None)" if type(None) in members else ""
        raise ConfigError(f"option '{name}' expects {type_name(tp)}{extra}, got {text!r}", name)
    origin = _origin(tp)
    stripped = text.strip() if not quoted else text
    if origin is typing.Literal:
        for option in typing.get_args(tp):
            try:
                if parse_text(text, type(option), name) == option:
                    return option
            except ConfigError:
                continue
        return coerce(text, tp, name)  # raises, listing the allowed values
    if tp is bool:
        word = stripped.lower()
        if word in _TRUE_WORDS:
            return True
        if word in _FALSE_WORDS:
            return False
        raise ConfigError(f"option '{name}' expects bool (true/false, 1/0, yes/no), got {text!r}", name)
    if tp is int:
        try:
            return int(stripped)
        except ValueError:
            pass
        try:  # "1e4" for an int option is common (max_steps=1e4): accept whole numbers
            as_float = float(stripped)
        except ValueError:
            as_float = math.nan
        if math.isfinite(as_float) and as_float.is_integer():
            return int(as_float)
        raise ConfigError(f"option '{name}' expects int, got {text!r}", name)
    if tp is float:
        if stripped.lower() in _YAML_FLOATS:
            return _YAML_FLOATS[stripped.lower()]
        try:
            return float(stripped)
        except ValueError:
            raise ConfigError(f"option '{name}' expects float (e.g. 0.5, 1e-5), got {text!r}", name) from None
    if tp is str:
        return str(text)
    if origin in (list, tuple, cabc.Sequence, cabc.MutableSequence, set, frozenset) or tp in (list, tuple):
        if quoted or not stripped.startswith("["):
            # comma-separated: "1,2,3"; "" is the empty list
            parts = [] if stripped == "" else [p.strip() for p in text.split(",")]
            return _parse_structure(parts, tp, name)
        return _parse_structure(_load_text_yaml(stripped, tp, name), tp, name)
    if origin in (dict, cabc.Mapping, cabc.MutableMapping) or tp in (dict, cabc.Mapping) or _is_dataclass_type(tp):
        loaded = _load_text_yaml(stripped, tp, name) if stripped else {}
        if not isinstance(loaded, dict):
            raise ConfigError(
                f"option '{name}' expects {type_name(tp)} as a YAML mapping like '{{key: value}}', got {text!r}",
                name,
            )
        return _parse_structure(loaded, tp, name)
    if isinstance(tp, type) and issubclass(tp, enum.Enum):
        for member in tp:
            if stripped in (member.name, str(member.value)):
                return member
        return _coerce_enum(text, tp, name)  # raises with the allowed values
    if tp is pathlib.Path or (isinstance(tp, type) and issubclass(tp, pathlib.PurePath)):
        return tp(text)
    raise ConfigError(f"option '{name}' ({type_name(tp)}) cannot be set from text; set it in Python or YAML", name)


def _parse_structure(value: Any, tp: Any, name: str) -> Any:
    """Like :func:`coerce`, but the leaves of ``value`` are text to parse."""
    if _is_union(tp):
        members = typing.get_args(tp)
        for member in members:
            if member is type(None):
                continue
            try:
                return _parse_structure(value, member, name)
            except ConfigError:
                continue
        raise _type_error(name, tp, value)
    origin = _origin(tp) or tp
    if isinstance(value, list):
        if origin not in (list, tuple, cabc.Sequence, cabc.MutableSequence, set, frozenset, Any, object):
            raise _type_error(name, tp, value)
        args = typing.get_args(tp)
        if origin is tuple and args and not (len(args) == 2 and args[1] is Ellipsis):
            if len(value) != len(args):
                raise ConfigError(
                    f"option '{name}' expects {len(args)} items ({type_name(tp)}), got {len(value)}", name
                )
            item_tps = list(args)
        else:
            item_tps = [args[0] if args else Any] * len(value)
        items = [parse_text(v, t, f"{name}[{i}]") for i, (v, t) in enumerate(zip(value, item_tps, strict=True))]
        return coerce(items, tp, name)
    if isinstance(value, dict):
        if _is_dataclass_type(tp):
            hints = _field_hints(tp)
            parsed = {}
            for key, sub in value.items():
                key = str(key)
                if key not in hints:  # let the builder raise its unknown-option error
                    parsed[key] = sub
                    continue
                parsed[key] = parse_text(sub, hints[key], f"{name}.{key}")
            return coerce(parsed, tp, name)
        if origin not in (dict, cabc.Mapping, cabc.MutableMapping, Any, object):
            raise _type_error(name, tp, value)
        args = typing.get_args(tp)
        key_tp, val_tp = args if len(args) == 2 else (Any, Any)
        return {parse_text(k, key_tp, f"{name}.<key>"): parse_text(v, val_tp, f"{name}.{k}") for k, v in value.items()}
    return parse_text(value, tp, name)


def _field_hints(tp: type) -> dict[str, Any]:
    return field_types(tp)


# -- rendering values back to override text -----------------------------------------------


def render_text(value: Any, tp: Any) -> str:
    """Override text that :func:`parse_text` reads back as ``value`` (for ``to_overrides``)."""
    if value is None:
        return "none"
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, enum.Enum):
        return str(value.name)
    if isinstance(value, float):
        return repr(value)
    if isinstance(value, int):
        return str(value)
    if isinstance(value, pathlib.PurePath):
        value = str(value)
    if isinstance(value, str):
        ambiguous = (
            value.strip().lower() in _NONE_WORDS
            or (len(value) >= 2 and value[0] == value[-1] and value[0] in "'\"")
            or ((tp is Any or tp is object) and _reads_as_other(value))
        )
        return f"'{value}'" if ambiguous else value
    if isinstance(value, (list, tuple, set, frozenset, dict)):
        plain = _plain_for_yaml(value)
        text = yaml.safe_dump(plain, default_flow_style=True, width=math.inf, allow_unicode=False).strip()
        # YAML folds a string with line breaks over several lines; JSON (also YAML) escapes
        # them on one line, unless it would need \u escapes (YAML reads an astral character's
        # surrogate pair as two characters): then the folded YAML, which reads back exactly
        one_line = json.dumps(plain) if "\n" in text else text
        return one_line if "\\u" not in one_line else text
    raise ConfigError(f"cannot write {type(value).__name__} {_show(value)} as an override")


def _reads_as_other(text: str) -> bool:
    """Whether YAML would read ``text`` as something other than that string."""
    try:
        return yaml.load(text, Loader=YamlLoader) != text  # noqa: S506 - SafeLoader subclass
    except yaml.YAMLError:
        return False


def _plain_for_yaml(value: Any) -> Any:
    if isinstance(value, enum.Enum):
        return value.name
    if isinstance(value, pathlib.PurePath):
        return str(value)
    if isinstance(value, (list, tuple, set, frozenset)):
        return [_plain_for_yaml(v) for v in value]
    if isinstance(value, dict):
        return {_plain_for_yaml(k): _plain_for_yaml(v) for k, v in value.items()}
    return value


# -- building dataclasses from mappings (used by coerce for nested dataclasses) ---------


def field_types(cls: type) -> dict[str, Any]:
    """Resolved annotations of the init fields of dataclass ``cls``."""
    return _field_types(cls)


# Typed ``type`` on the public function: the type checker takes a dataclass (whose instances
# are unhashable) for an unhashable cache key, though the class object itself hashes fine.
@functools.lru_cache(maxsize=None)
def _field_types(cls: type) -> dict[str, Any]:
    try:
        hints = typing.get_type_hints(cls)
    except NameError as err:  # e.g. a config class defined inside a function + postponed annotations
        raise TypeError(f"cannot resolve the annotations of {cls.__name__}: {err}") from err
    return {f.name: hints.get(f.name, Any) for f in dataclasses.fields(cls) if f.init}


def unknown_option(key: str, cls: type, allowed: Iterable[str]) -> ConfigError:
    allowed = sorted(allowed)
    close = difflib.get_close_matches(key, allowed, n=1, cutoff=0.6)
    hint = f"; did you mean '{close[0]}'?" if close else ";"
    return ConfigError(f"unknown option '{key}' for {cls.__name__}{hint} allowed: {', '.join(allowed)}", key)


def build_dataclass(cls: type, data: Mapping[str, Any]) -> Any:
    """Build dataclass ``cls`` from a mapping: unknown keys, missing and mistyped values raise."""
    if not isinstance(data, Mapping):
        raise ConfigError(f"{cls.__name__} expects a mapping of options, got {type(data).__name__}")
    hints = field_types(cls)
    kwargs = {}
    for key, value in data.items():
        if not isinstance(key, str) or key not in hints:
            raise unknown_option(str(key), cls, hints)
        kwargs[key] = coerce(value, hints[key], key)
    missing = [
        f.name
        for f in dataclasses.fields(cls)
        if f.init
        and f.name not in kwargs
        and f.default is dataclasses.MISSING
        and f.default_factory is dataclasses.MISSING
    ]
    if missing:
        names = ", ".join(missing)
        raise ConfigError(f"{cls.__name__}: missing required option(s) {names}; give a value", missing[0])
    return cls(**kwargs)
