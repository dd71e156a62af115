"""The rows of a decoding batch that still run, and how to drop the finished ones.

Without this, a row that has written EOS (or a stop string) keeps going through every
forward pass until the last row of its batch stops: at the main job's settings about
two rows in five end early, so a large share of the decoding work was spent on padding.
:class:`ActiveRows` keeps the batch state (KV cache rows, attention mask, positions, the
per-row generators and adapter names) for the running rows only, shrinking it whenever
enough rows have finished to pay for the copy.

Dropping rows changes no sampled token as long as every row draws from its own generator
(each row's stream is its own, whatever else is in the batch); with one generator shared
by the batch, the draws of the dropped rows would be missing from the stream, so the
sampler keeps every row then (:func:`ActiveRows.can_drop`).
"""

from __future__ import annotations

from typing import Any, Sequence

import torch

from comlrl_core.models.kv_cache import repeatable_layer_types

__all__ = ["ActiveRows", "select_cache_rows"]


def select_cache_rows(cache: Any, index: torch.Tensor) -> bool:
    """Keep only the batch rows ``index`` of every layer of ``cache``, in place. False
    (cache untouched) when a layer is of a kind this does not know how to shrink."""
    layers = getattr(cache, "layers", None)
    if not layers or not isinstance(layers, list):
        return False
    for layer in layers:
        if not (hasattr(layer, "select_rows") or _plain_keys_and_values(layer)):
            return False
    for layer in layers:
        if hasattr(layer, "select_rows"):
            layer.select_rows(index)
        else:
            layer.keys = layer.keys.index_select(0, index)
            layer.values = layer.values.index_select(0, index)
    return True


def _plain_keys_and_values(layer: Any) -> bool:
    """A layer whose whole per-row state is its keys and values (transformers' DynamicLayer)."""
    return type(layer) in repeatable_layer_types() and getattr(layer, "keys", None) is not None


class ActiveRows:
    """Indices (into the full batch) of the rows still decoding, plus the per-row state
    that must shrink with them."""

    def __init__(self, batch: int, device: torch.device | str, min_drop_fraction: float = 0.25) -> None:
        self.index = torch.arange(batch, device=device)
        self.min_drop_fraction = min_drop_fraction

    def __len__(self) -> int:
        return int(self.index.numel())

    @staticmethod
    def can_drop(generator: torch.Generator | Sequence[torch.Generator] | None) -> bool:
        """Rows may be dropped only when each row samples from its own generator."""
        return generator is not None and not isinstance(generator, torch.Generator)

    def worth_dropping(self, finished: torch.Tensor) -> bool:
        """Whether enough of the running rows have finished (``finished``: full batch)."""
        done = int(finished[self.index].sum())
        return done > 0 and (done == len(self) or done >= self.min_drop_fraction * len(self))

    def drop_finished(
        self,
        finished: torch.Tensor,
        cache: Any,
        mask: torch.Tensor,
        positions: torch.Tensor,
        generator: Sequence[torch.Generator],
        adapter_names: list[str] | None,
    ) -> tuple[torch.Tensor, torch.Tensor, list[torch.Generator], list[str] | None] | None:
        """Drop the finished rows from the cache (in place) and return the shrunk mask,
        positions, generators and adapter names; None when the cache cannot shrink (then
        nothing changed)."""
        keep = torch.nonzero(~finished[self.index]).flatten()
        if not select_cache_rows(cache, keep):
            return None
        kept = keep.tolist()
        self.index = self.index[keep]
        names = None if adapter_names is None else [adapter_names[i] for i in kept]
        return mask[keep], positions[keep], [generator[i] for i in kept], names
