"""AboveThreshold, the sparse vector technique, on exact integers (DESIGN 7 and 8).

One *run* answers a stream of queries "is q_i above T_i?" and pays only for its
positive answers: with ``max_positives`` = c, a run is (epsilon_threshold +
epsilon_queries)-DP however many negative answers it gives (Lyu, Su, Li 2017,
Algorithm 1; Dwork and Roth 2014, Theorem 3.23 for c = 1).

Neighbouring streams. Queries are integers (the caller scales its statistic to a
fixed resolution). One privacy unit may move every query of the run, each by an
amount in an interval of width ``width`` that contains 0, e.g. [-tau, 1 - tau] for the
surge statistic f - tau n at resolution 1 (one event per unit per window). The
standard proof shifts the noisy threshold by the largest upward move (at most
``width``) and each positive answer's noise by the width of the interval (not twice
the sensitivity, as for arbitrary +-Delta queries): with threshold noise of scale
width / epsilon_threshold and query noise of scale c width / epsilon_queries, the
output sequence has probability ratio at most exp(epsilon_threshold +
epsilon_queries) between neighbours.

Float safety: every value is an integer and the noise is OpenDP's discrete Laplace,
so "q_i + nu_i >= T_i + rho" is an exact comparison; no rounding can break the
coupling the proof relies on.

>>> run = AboveThreshold(epsilon_threshold=0.5, epsilon_queries=0.5, width=1, rng=3)
>>> run.start()
>>> [run.test_one(q, 50) for q in (0, 2, 1, 400)]
[False, False, False, True]
>>> run.exhausted
True
"""

from __future__ import annotations

import math

from monitor.dp import NoiseSource, noise_source

__all__ = ["AboveThreshold"]


class AboveThreshold:
    """Sparse vector runs over integer queries of bounded width.

    Parameters
    ----------
    epsilon_threshold, epsilon_queries:
        Shares of one run's epsilon spent on the noisy threshold and on the queries.
        A run is (epsilon_threshold + epsilon_queries, 0)-DP.
    width:
        Width of the interval (containing 0) by which one privacy unit can move each
        query, in the queries' integer units.
    max_positives:
        c: positive answers a run may give before it is exhausted and a new run (a new
        charge, a fresh threshold) is needed.
    rng:
        None in production (OpenDP, OS randomness); a seed for tests.
    """

    def __init__(self, epsilon_threshold: float, epsilon_queries: float, width: int, max_positives: int = 1, rng=None) -> None:
        for name, value in (("epsilon_threshold", epsilon_threshold), ("epsilon_queries", epsilon_queries)):
            if not (value > 0 and math.isfinite(value)):
                raise ValueError(f"{name} must be a positive finite number, got {value!r}")
        if int(width) != width or width < 1:
            raise ValueError(f"width must be a positive integer, got {width!r}")
        if int(max_positives) != max_positives or max_positives < 1:
            raise ValueError(f"max_positives must be a positive integer, got {max_positives!r}")
        self.epsilon_threshold = float(epsilon_threshold)
        self.epsilon_queries = float(epsilon_queries)
        self.width = int(width)
        self.max_positives = int(max_positives)
        self._noise: NoiseSource = noise_source(rng)
        self._rho: int | None = None
        self.positives = 0

    @property
    def epsilon(self) -> float:
        """What one run costs: pure DP, delta = 0."""
        return self.epsilon_threshold + self.epsilon_queries

    @property
    def threshold_scale(self) -> float:
        return self.width / self.epsilon_threshold

    @property
    def query_scale(self) -> float:
        return self.max_positives * self.width / self.epsilon_queries

    @property
    def active(self) -> bool:
        """A run is open and may still answer."""
        return self._rho is not None and not self.exhausted

    @property
    def exhausted(self) -> bool:
        return self._rho is not None and self.positives >= self.max_positives

    def start(self) -> None:
        """Open a new run: draw a fresh threshold noise. The caller charges ``epsilon`` first."""
        self._rho = self._noise.discrete_laplace(self.threshold_scale)
        self.positives = 0

    def stop(self) -> None:
        """Close the run (e.g. at a restart): the next answer needs a new run."""
        self._rho = None
        self.positives = 0

    def test_one(self, query: int, threshold: int) -> bool:
        """Is ``query`` above ``threshold``? Noisy, exact integer comparison; a positive
        answer uses one of the run's ``max_positives``."""
        if not self.active:
            raise RuntimeError("no active run: call start() (and charge the run) first")
        noisy = self._noise.discrete_laplace(self.query_scale, center=int(query))
        above = noisy >= int(threshold) + self._rho
        if above:
            self.positives += 1
        return bool(above)
