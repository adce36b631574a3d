"""AboveThreshold, the sparse vector technique, on exact integers (docs/design.md#the-alarm).

One *run* draws a noisy threshold once and answers a stream of integer queries "is q_i above
T_i?"; its negative answers are free and each positive answer has a price.

Neighbours: one privacy unit may move every query of the run, each by an amount in
[-m_i, width - m_i], an interval of width ``width`` that contains 0 (e.g. [-tau, 1 - tau] for
the surge statistic f - tau n at resolution 1), every m_i of the run in one band
[m_lo, m_lo + drift] inside [0, width]. ``reach`` bounds the largest move in one direction
(at most max(width - m_lo, m_lo + drift) <= width; 1 for the rhythm reference's [-L, 1]).

Guarantee, per outcome: with threshold noise of scale reach / epsilon_threshold and query
noise of scale (width + drift) / epsilon_positive, every output sequence o with k(o) positive
answers has P[o | D] <= exp(epsilon_threshold + k(o) epsilon_positive) P[o | D'] for
neighbouring D, D'. So a caller may pay as it goes: charge epsilon_threshold when the run
starts and epsilon_positive with each positive answer, and ask only when its budget could pay
one more (a privacy filter); a run that stops after c positives is
(epsilon_threshold + c epsilon_positive, 0)-DP. Both noises are one-sided, |Z| for Z OpenDP's
discrete Laplace (``NoiseSource.folded_discrete_laplace``): the proof shifts each only
upwards. Proof: docs/proofs/alarm-run.md; tests: ``tests/test_alarm.py`` computes every
answer sequence's exact probability under both neighbours (``tests/svt_exact.py``).

Float safety: every value is an integer and the noise is discrete, so "q_i + nu_i >= T_i +
rho" is an exact comparison (docs/design.md#floating-point).

>>> run = AboveThreshold(epsilon_threshold=0.5, epsilon_positive=0.5, width=1, rng=3)
>>> run.start()
>>> [run.test_one(q, 50) for q in (0, 2, 1, 400)]
[False, False, False, True]
>>> run.positives, run.epsilon_spent
(1, 1.0)
"""

from __future__ import annotations

import math

from monitor.dp import NoiseSource, noise_source

__all__ = ["AboveThreshold"]


class AboveThreshold:
    """Sparse vector runs over integer queries of bounded width, paid per positive answer.

    Parameters
    ----------
    epsilon_threshold:
        Epsilon of a run's noisy threshold: paid once, when the run starts.
    epsilon_positive:
        Epsilon of each positive answer: paid when it is given.
    width:
        Width of the interval (containing 0) by which one privacy unit can move each
        query, in the queries' integer units.
    drift:
        How far the intervals of one run's queries may be offset from one another (see
        the module docstring), in the same units; the positive answers' noise covers it.
    reach:
        The largest move of a query in either direction (at most ``width``, at least half
        of it), in the same units; the threshold noise covers it. None: ``width``.
    rng:
        None in production (OpenDP, OS randomness); a seed for tests.
    """

    def __init__(self, epsilon_threshold: float, epsilon_positive: float, width: int, drift: int = 0,
                 reach: int | None = None, rng=None) -> None:
        for name, value in (("epsilon_threshold", epsilon_threshold), ("epsilon_positive", epsilon_positive)):
            if not (value > 0 and math.isfinite(value)):
                raise ValueError(f"{name} must be a positive finite number, got {value!r}")
        if int(width) != width or width < 1:
            raise ValueError(f"width must be a positive integer, got {width!r}")
        if int(drift) != drift or not 0 <= drift <= width:
            raise ValueError(f"drift must be an integer in [0, width], got {drift!r}")
        self.epsilon_threshold = float(epsilon_threshold)
        self.reach = width if reach is None else reach
        self.epsilon_positive = float(epsilon_positive)
        self.width = int(width)
        self.drift = int(drift)
        self.reach = _checked_reach(self.reach, self.width)
        self._noise: NoiseSource = noise_source(rng)
        self._rho: int | None = None
        self.positives = 0

    @property
    def epsilon_spent(self) -> float:
        """What the current run has cost so far: epsilon_threshold + positives x epsilon_positive (pure DP)."""
        return self.epsilon_threshold + self.positives * self.epsilon_positive

    @property
    def threshold_scale(self) -> float:
        return self.reach / self.epsilon_threshold

    @property
    def query_scale(self) -> float:
        return (self.width + self.drift) / self.epsilon_positive

    @property
    def active(self) -> bool:
        """A run is open."""
        return self._rho is not None

    def start(self) -> None:
        """Open a new run: draw a fresh threshold noise. The caller charges ``epsilon_threshold`` first."""
        self._rho = self._noise.folded_discrete_laplace(self.threshold_scale)
        self.positives = 0

    def resume(self, rho: int) -> None:
        """Go on with a run begun in a stopped process, before any positive answer: the same
        threshold noise ``rho`` (kept secret beside the ledger), so the queries after the restart
        and before it are one run (``monitor.budget.run_state``)."""
        if isinstance(rho, bool) or int(rho) != rho or rho < 0:
            raise ValueError(f"a run's threshold noise is a non-negative integer, got {rho!r}")
        self._rho = int(rho)
        self.positives = 0

    def stop(self) -> None:
        """Close the run (its span ended, or a restart): the next query needs a new run."""
        self._rho = None
        self.positives = 0

    def test_one(self, query: int, threshold: int) -> bool:
        """Is ``query`` above ``threshold``? Noisy, exact integer comparison. Ask only when
        the budget can pay ``epsilon_positive`` should the answer be positive."""
        if self._rho is None:
            raise RuntimeError("no active run: call start() (and charge the run) first")
        noisy = int(query) + self._noise.folded_discrete_laplace(self.query_scale)
        above = noisy >= int(threshold) + self._rho
        if above:
            self.positives += 1
        return bool(above)


def _checked_reach(reach: int, width: int) -> int:
    # An interval of width ``width`` that contains 0 reaches at least width / 2 on one side.
    if int(reach) != reach or not width <= 2 * reach <= 2 * width:
        raise ValueError(f"reach must be an integer in [width / 2, width] = [{width / 2}, {width}], got {reach!r}")
    return int(reach)
