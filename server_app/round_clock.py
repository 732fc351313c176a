"""Elapsed time and an estimate of the time left, for the ServerApp's log line after every round."""

from __future__ import annotations

import time
from collections.abc import Callable


def format_duration(seconds: float) -> str:
    """``1h02m``, ``3m05s`` or ``42s``: short enough for a log line."""
    seconds = max(0, round(seconds))
    hours, rest = divmod(seconds, 3600)
    minutes, secs = divmod(rest, 60)
    if hours:
        return f"{hours}h{minutes:02d}m"
    return f"{minutes}m{secs:02d}s" if minutes else f"{secs}s"


class RoundClock:
    """Times the rounds of one run and estimates when the last one ends.

    The estimate is the mean duration of the rounds run so far (in this
    process: a resumed run starts counting at its first round) times the
    rounds left. Rounds with a validation evaluation take longer than the
    others, so the estimate swings a little between them; the test
    evaluation after the last round is not included.

    Parameters
    ----------
    first_round, last_round : int
        The rounds this process runs (``first_round`` > 1 when resuming; ``last_round + 1``
        when it runs none, finishing a checkpoint of the last round).
    clock : callable
        Seconds, monotonic (``time.monotonic``; tests pass their own).
    """

    def __init__(self, first_round: int, last_round: int, clock: Callable[[], float] = time.monotonic) -> None:
        if last_round < first_round - 1:
            raise ValueError(f"RoundClock: last round {last_round} is before the first round {first_round}")
        self.first_round = first_round
        self.last_round = last_round
        self.clock = clock
        self.started = clock()

    def remaining(self, server_round: int) -> float:
        """Estimated seconds until round ``last_round`` ends, once round ``server_round`` has ended."""
        done = server_round - self.first_round + 1
        if done < 1:
            raise ValueError(f"RoundClock: round {server_round} is before the first round {self.first_round}")
        return (self.clock() - self.started) / done * (self.last_round - server_round)

    def line(self, server_round: int) -> str:
        """``round 3/10 done: 1m05s elapsed, about 2m32s left``."""
        elapsed = self.clock() - self.started
        return (f"round {server_round}/{self.last_round} done: {format_duration(elapsed)} elapsed, "
                f"about {format_duration(self.remaining(server_round))} left")
