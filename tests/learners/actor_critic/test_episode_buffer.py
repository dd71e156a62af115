"""The episode buffer: whole episodes only, ready at capacity, exact round trip."""

from __future__ import annotations

import json

import pytest

from learners.actor_critic.episode_buffer import EpisodeBuffer
from learners.common.episodes import AgentTurn, Episode, Turn


def _episode(task: int, rewards: list[float]) -> Episode:
    turns = [
        Turn([AgentTurn(f"p{t}", f"c{t}", [1, 2], [3, t]), AgentTurn("q", "d", [4], [])], r, f"state {t}")
        for t, r in enumerate(rewards)
    ]
    return Episode(task=task, turns=turns, terminated=len(rewards) < 3)


def test_ready_at_capacity_and_drain_empties():
    buf = EpisodeBuffer(2)
    buf.add(_episode(0, [1.0]))
    assert not buf.ready
    buf.add(_episode(1, [0.5, 0.2]))
    assert buf.ready and len(buf) == 2
    drained = buf.drain()
    assert [e.task for e in drained] == [0, 1] and len(buf) == 0 and not buf.ready


def test_partial_episodes_are_refused():
    with pytest.raises(ValueError, match="complete episodes"):
        EpisodeBuffer(1).add(Episode(task=0))
    with pytest.raises(ValueError, match="capacity"):
        EpisodeBuffer(0)


def test_json_round_trip_is_exact():
    buf = EpisodeBuffer(3)
    buf.add(_episode(4, [0.1, 0.2, 0.3]))
    buf.add(_episode(5, [1.0]))
    other = EpisodeBuffer(3)
    other.load_list(json.loads(json.dumps(buf.to_list())))
    assert [e.to_dict() for e in other] == [e.to_dict() for e in buf]
    assert list(other)[1].terminated is True and list(other)[0].rewards == [0.1, 0.2, 0.3]
