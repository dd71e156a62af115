"""Old flat module paths keep working for one release, with a DeprecationWarning."""

from __future__ import annotations

import importlib
import sys

import pytest

from comlrl_core._moved import MOVED_MODULES


@pytest.mark.parametrize("old", sorted(MOVED_MODULES))
def test_old_path_warns_and_forwards_to_the_new_module(old: str) -> None:
    sys.modules.pop(old, None)
    new = importlib.import_module(MOVED_MODULES[old])
    with pytest.warns(DeprecationWarning, match=f"{old} moved to {MOVED_MODULES[old]}"):
        alias = importlib.import_module(old)
    public = [n for n in getattr(new, "__all__", dir(new)) if not n.startswith("_")]
    assert public, f"{MOVED_MODULES[old]} exports nothing to forward"
    for name in public:
        assert getattr(alias, name) is getattr(new, name)


def test_from_import_of_an_old_path_gives_the_new_objects() -> None:
    sys.modules.pop("comlrl_core.hf_policy", None)
    with pytest.warns(DeprecationWarning):
        from comlrl_core.hf_policy import TransformersPolicy  # noqa: PLC0415
    from comlrl_core.models.hf_policy import TransformersPolicy as moved

    assert TransformersPolicy is moved


def test_unknown_names_still_fail() -> None:
    with pytest.raises(ModuleNotFoundError):
        importlib.import_module("comlrl_core.no_such_module")
    sys.modules.pop("comlrl_core.tiny", None)
    with pytest.warns(DeprecationWarning):
        alias = importlib.import_module("comlrl_core.tiny")
    with pytest.raises(AttributeError):
        alias.no_such_name  # noqa: B018
