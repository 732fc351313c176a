"""The filtered mean's memory: a site that stands out round after round stays out.

The filtered mean (:mod:`~fedsm_core.algorithms.filtered_mean`) judges each
round on its own. A site trained on wrong masks (label flipping) sends a
plausible, well-shaped update that lies several typical distances from the
coordinate median in most rounds, but not in all: in the rounds where its
distance ratio dips under the bound its update is averaged in, and a few such
rounds are enough to undo the honest sites' progress
(``experiments/results/robustness``). An honest site whose data differ from
the others' (another annotation protocol) also lies farther out than the rest,
but by less, and not by more than the bound on average.

So the memory keeps, per site, the mean of its distance ratios over every
round it replied in, this round included; with ``r_k(s) = d_k(s) / median_j d_j(s)``
(:class:`~fedsm_core.algorithms.filtered_mean.FilterDecision.scores`) and
``c`` the ``filter-factor``::

    leave k out in round t  iff  r_k(t) > c  or  mean_{s <= t, k replied} r_k(s) > c

It only ever leaves out more than the round's own bound: where every site's
mean ratio is within ``c`` the filtered mean is unchanged (and where the
memory would leave out every reply, the round's own bound decides). What it cannot stop
is a site that stays within ``c`` typical distances on average (a slow
drift), or a colluding majority, which moves the median itself.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import numpy as np

MEMORY_KEY = "filter-memory"  # its entry in a server optimizer's state (model array keys have no hyphen)


class FilterMemory:
    """Per site: the sum of its distance ratios and the number of rounds they came from."""

    def __init__(self) -> None:
        self.totals: dict[str, float] = {}
        self.rounds: dict[str, int] = {}

    def record(self, sites: Sequence[str], ratios: Sequence[float]) -> None:
        """Add one round's distance ratios, one per replying site (in reply order); each finite, >= 0."""
        if len(sites) != len(ratios):
            raise ValueError(f"filter memory: {len(sites)} sites but {len(ratios)} distance ratios")
        if len(set(sites)) != len(sites):
            raise ValueError(f"filter memory: a site replied twice in one round: {list(sites)}")
        for site, ratio in zip(sites, ratios, strict=True):
            if not np.isfinite(ratio) or ratio < 0:
                raise ValueError(f"filter memory: site '{site}' has distance ratio {ratio}; expected a finite one >= 0")
            self.totals[site] = self.totals.get(site, 0.0) + float(ratio)
            self.rounds[site] = self.rounds.get(site, 0) + 1

    def mean_ratio(self, site: str) -> float:
        """The site's mean distance ratio over the rounds recorded (0 before its first)."""
        rounds = self.rounds.get(site, 0)
        return self.totals[site] / rounds if rounds else 0.0

    def far(self, sites: Sequence[str], factor: float) -> np.ndarray:
        """Boolean mask over ``sites``: those whose mean distance ratio exceeds ``factor``."""
        return np.array([self.mean_ratio(site) > factor for site in sites], dtype=bool)

    def state_dict(self) -> dict[str, np.ndarray]:
        """Per site ``[sum of ratios, rounds]`` (float64), for checkpoints."""
        return {site: np.array([self.totals[site], float(self.rounds[site])]) for site in sorted(self.totals)}

    def load_state_dict(self, state: Mapping[str, np.ndarray]) -> None:
        """Restore :meth:`state_dict`'s output."""
        self.totals = {site: float(values[0]) for site, values in state.items()}
        self.rounds = {site: int(values[1]) for site, values in state.items()}
