"""Typed, validated configuration dataclasses loadable from YAML and ``key=value`` overrides.

``options`` holds :class:`BaseConfig` and the option helpers; ``coercion`` turns YAML and
override text into typed values.
"""

from comlrl_core.config.coercion import ConfigError
from comlrl_core.config.options import (
    BaseConfig,
    build_dataclass,
    check_in,
    check_positive,
    check_range,
    describe_options,
    field_types,
    option,
    parse_overrides,
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
