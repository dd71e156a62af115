"""The buffer that holds whole episodes until an update.

Episodes (:class:`learners.common.episodes.Episode`) are pushed only when they have
ended, so the buffer never holds part of one and the policy cannot change between the
turns of one episode. Episodes are plain lists and strings, so a buffer checkpoints
exactly (``to_list`` / ``load_list``).
"""

from __future__ import annotations

from typing import Any, Iterator

from learners.common.episodes import Episode


class EpisodeBuffer:
    """Complete episodes waiting for an update; ``ready`` once ``capacity`` are held."""

    def __init__(self, capacity: int) -> None:
        if capacity < 1:
            raise ValueError(f"buffer capacity must be >= 1, got {capacity}")
        self.capacity = capacity
        self._episodes: list[Episode] = []

    def add(self, episode: Episode) -> None:
        if not isinstance(episode, Episode) or not episode.turns:
            raise ValueError("only complete episodes (at least one turn) go into the buffer")
        self._episodes.append(episode)

    @property
    def ready(self) -> bool:
        return len(self._episodes) >= self.capacity

    def drain(self) -> list[Episode]:
        """Every held episode, oldest first; the buffer is empty afterwards."""
        out, self._episodes = self._episodes, []
        return out

    def __len__(self) -> int:
        return len(self._episodes)

    def __iter__(self) -> Iterator[Episode]:
        return iter(self._episodes)

    def to_list(self) -> list[dict[str, Any]]:
        return [e.to_dict() for e in self._episodes]

    def load_list(self, data: list[dict[str, Any]]) -> None:
        self._episodes = [Episode.from_dict(d) for d in data]
