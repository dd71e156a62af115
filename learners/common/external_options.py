"""CoMLRL's ways of configuring the external transition, mapped onto ours.

* CoMLRL's YAML configs carry an ``external:`` section (``external: {mode: level_feedback,
  sandbox_slice: 1}``). Ours hand such settings to the environment through ``env_kwargs``;
  :func:`fold_external_section` moves the section there, ``mode`` becoming the env's
  ``external_transition`` and every other key keeping its name (``sandbox_slice``,
  ``expert_model`` ...). A key set both in the section and in ``env_kwargs`` with
  different values is a config error.
* ``external_prompt_passthrough`` is a learner option in CoMLRL; ours also accept it in
  ``env_kwargs``. :func:`check_prompt_passthrough` refuses the two places disagreeing.
"""

from __future__ import annotations

from typing import Any, Collection, Mapping

from comlrl_core.config.options import ConfigError

PASSTHROUGH = "external_prompt_passthrough"
_SECTION_NAMES = {"mode": "external_transition"}  # CoMLRL's key -> the env's argument


def fold_external_section(data: Mapping[str, Any], option_names: Collection[str] = ()) -> dict[str, Any]:
    """``data`` (raw options) with an ``external`` section folded into ``env_kwargs``; a key
    of the section that is one of ``option_names`` (a learner option, e.g.
    ``external_prompt_passthrough``) becomes that option instead."""
    out = dict(data)
    if "external" not in out or "external" in option_names:
        return out
    section = out.pop("external")
    if section is None:
        return out
    if not isinstance(section, Mapping):
        raise ConfigError(
            f"option 'external' (CoMLRL's section) must be a mapping such as {{mode: level_feedback}}, "
            f"got {type(section).__name__}",
            "external",
        )
    env_kwargs = dict(out.get("env_kwargs") or {})
    for key, value in section.items():
        if key in option_names:
            _put(out, str(key), value, f"external.{key}", str(key))
            continue
        name = _SECTION_NAMES.get(str(key), str(key))
        _put(env_kwargs, name, value, f"external.{key}", f"env_kwargs.{name}")
    out["env_kwargs"] = env_kwargs
    return out


def _put(target: dict[str, Any], name: str, value: Any, given_as: str, other: str) -> None:
    if name in target and target[name] != value:
        raise ConfigError(
            f"{given_as}={value!r} and {other}={target[name]!r} disagree; set it in one place",
            given_as,
        )
    target[name] = value


def check_prompt_passthrough(option: bool | None, env_kwargs: Mapping[str, Any]) -> None:
    """Refuse ``external_prompt_passthrough`` set both as the option and in ``env_kwargs``
    with different values."""
    if option is None or PASSTHROUGH not in env_kwargs:
        return
    if bool(env_kwargs[PASSTHROUGH]) != option:
        raise ConfigError(
            f"option 'external_prompt_passthrough' is {option} but env_kwargs.external_prompt_passthrough is "
            f"{env_kwargs[PASSTHROUGH]!r}; set it once (the option)",
            PASSTHROUGH,
        )
