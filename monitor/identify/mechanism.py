"""The optimal private yes/no answer to "is this record a (beta, r)-anomaly?" (docs/design.md#anomaly-queries).

For a yes/no function f on a neighbour graph, with m >= 1 the graph distance from the
database to the nearest one where f has the other answer, the mechanism answers f
correctly with probability

    1 - exp(-epsilon * (m - 1)) / (1 + exp(epsilon))        (1 when m is infinite).

It is epsilon-private on that graph whenever m >= 1 and m changes by at most 1 along
every edge where f stays the same (Asif et al., Theorem 4.4; the graph distance has
both properties, and so does the bound of ``monitor.identify.anomaly.flip_distance``).
At m = 1 it is randomized response, which no epsilon-private mechanism beats.

Which graph: ``sensitive_k=None`` is the ordinary graph (pure epsilon-DP, add/remove one
reference record); an integer k is the k-sensitive graph of the seed: (epsilon, k)-
sensitive privacy, Definition 3.2, which protects every record that is normal or could
become normal within k changes, and lets anomalies be identified far more accurately.

What the analyst learns besides the answer: nothing data-dependent. m depends on the
data, so the probability of being correct is reported as its worst case over all
databases (m = 1), ``exp(eps) / (1 + exp(eps))``; ``IdentifyAnswer.probability_correct_if``
evaluates the formula for an m the analyst assumes.

>>> from monitor.identify.anomaly import Neighbourhood
>>> ident = AnomalyIdentifier(beta=3, radius=0.1).fit([[0.0, 0.0], [0.05, 0.0], [0.9, 0.9]])
>>> a = ident.answer([0.9, 0.9], epsilon=1.0, sensitive_k=1, rng=0)
>>> a.mechanism, a.sensitive_k, round(a.probability_correct, 3)
('identify_sensitive', 1, 0.731)
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass
from typing import Sequence

import numpy as np
from scipy.spatial import cKDTree

from monitor.dp import Release, noise_source
from monitor.identify.anomaly import Neighbourhood, check_parameters, flip_distance, is_anomaly, sensitive_threshold

__all__ = ["IdentifyAnswer", "AnomalyIdentifier", "probability_correct", "probability_wrong", "randomized_answer"]

# Triangle-inequality arguments compare float distances; counting the outer balls with a
# hair of slack can only lower the bound on m, which keeps it safe.
_SLACK = 1e-9


def probability_wrong(epsilon: float, m: float) -> float:
    """exp(-epsilon (m - 1)) / (1 + exp(epsilon)): the probability of the wrong answer at flip distance m.

    >>> probability_wrong(1.0, math.inf)
    0.0
    """
    _check_epsilon(epsilon)
    if not m >= 1:
        raise ValueError(f"the flip distance m must be >= 1, got {m!r}")
    if math.isinf(m):
        return 0.0
    # Written as one exponential so that tiny probabilities keep their relative precision.
    return math.exp(-epsilon * (m - 1) - math.log1p(math.exp(epsilon)))


def probability_correct(epsilon: float, m: float) -> float:
    """Probability that the mechanism's answer is right when the flip distance is m.

    >>> round(probability_correct(1.0, 1), 4), round(probability_correct(1.0, 3), 4), probability_correct(1.0, math.inf)
    (0.7311, 0.9636, 1.0)
    """
    return 1.0 - probability_wrong(epsilon, m)


def randomized_answer(truth: bool, m: float, epsilon: float, rng=None) -> bool:
    """Answer ``truth`` with probability ``probability_correct(epsilon, m)``, else the other.

    Guarantee: epsilon-private on a neighbour graph on which m is a valid flip distance
    (>= 1, 1 at the boundary, changing by at most 1 along edges with the same answer).
    ``rng=None``: OS-seeded randomness; the draw is one uniform, as in randomized response.

    >>> randomized_answer(True, math.inf, 0.1, rng=1)
    True
    """
    wrong = probability_wrong(epsilon, m)
    u = float(noise_source(rng).generator.random())
    return (not truth) if u < wrong else bool(truth)


@dataclass(frozen=True)
class IdentifyAnswer(Release):
    """One private answer: ``value`` (alias ``answer``) is True for "it is an anomaly".

    ``probability_correct`` is the WORST case over all databases (m = 1). The actual
    probability is higher the further the data is from the other answer, but that
    distance depends on the data and is not released.
    """

    value: bool
    sensitive_k: int | None = None
    beta: int = 1
    radius: float = 0.0
    include_record: bool = False
    probability_correct: float = 0.5

    @property
    def answer(self) -> bool:
        return bool(self.value)

    def probability_correct_if(self, m: float) -> float:
        """The probability of a correct answer had the flip distance been m (public maths)."""
        return probability_correct(self.epsilon, m)

    def as_dict(self) -> dict:
        out = asdict(self)
        del out["accuracy"]  # a bit's accuracy is probability_correct
        return out


class AnomalyIdentifier:
    """Private (beta, r)-anomaly queries against scaled reference data.

    Parameters
    ----------
    beta, radius:
        A record is a (beta, radius)-anomaly when it is present and at most beta
        records (itself included) lie within Euclidean distance ``radius`` of it, in
        the [0, 1] space of ``monitor.features.scale_to_unit``.
    include_record:
        Answer over the reference data plus the queried record (for records not in
        the reference data, e.g. incoming events); then "yes" iff
        1 + (reference records within radius) <= beta.
    """

    def __init__(self, beta: int, radius: float, *, include_record: bool = False) -> None:
        check_parameters(beta)
        if not (radius > 0 and math.isfinite(radius)):
            raise ValueError(f"radius must be a positive finite number, got {radius!r}")
        self.beta, self.radius, self.include_record = int(beta), float(radius), bool(include_record)

    def fit(self, X: "Sequence[Sequence[float]] | np.ndarray") -> "AnomalyIdentifier":
        """Index the reference records X (already scaled to [0, 1])."""
        X = np.asarray(X, dtype=float)
        if X.ndim != 2 or X.shape[0] == 0 or not np.all(np.isfinite(X)):
            raise ValueError(f"reference data must be a non-empty finite 2-D array, got shape {X.shape}")
        self.tree_ = cKDTree(X)
        self.n_features_in_ = X.shape[1]
        return self

    def neighbourhoods(
        self, Q: "Sequence[Sequence[float]] | np.ndarray", sensitive_k: int | None = None
    ) -> list[Neighbourhood]:
        """The counts around each query (scaled) that the answer and m depend on. NOT private."""
        Q = self._queries(Q)
        tree, n, r = self.tree_, self.tree_.n, self.radius
        T = sensitive_threshold(self.beta, sensitive_k)
        copies = tree.query_ball_point(Q, 0.0, return_length=True)
        within_r = tree.query_ball_point(Q, r, return_length=True)
        if T == 0:
            # Ordinary graph (or k >= beta): c_1 alone decides.
            return [Neighbourhood(int(x), (int(c),), n) for x, c in zip(copies, within_r)]
        # Only the T nearest records matter for the shells t >= 2 that are short of T.
        dist, _ = tree.query(Q, k=min(T, n))
        dist = np.asarray(dist, dtype=float).reshape(len(Q), -1)
        out = []
        for x, c, d in zip(copies, within_r, dist):
            within = [int(c)]
            t = 2
            while within[-1] < min(T, n):
                within.append(int(np.count_nonzero(d <= t * r * (1 + _SLACK))))
                t += 1
            out.append(Neighbourhood(int(x), tuple(within), n))
        return out

    def exact_answers(self, Q: "Sequence[Sequence[float]] | np.ndarray") -> np.ndarray:
        """The true (beta, r)-anomaly answers. NOT private: for tests and benchmarks only."""
        return np.array([is_anomaly(nb, self.beta, self.include_record) for nb in self.neighbourhoods(Q)], dtype=bool)

    def answer(self, record: Sequence[float], epsilon: float, sensitive_k: int | None = None, rng=None) -> IdentifyAnswer:
        """Privately answer whether one scaled record is a (beta, radius)-anomaly.

        Guarantee: epsilon-DP for adding or removing one reference record when
        ``sensitive_k`` is None; (epsilon, k)-sensitive privacy (seed Definition 3.2)
        otherwise. Each call spends epsilon (sequential composition).
        """
        return self.answer_many([record], epsilon, sensitive_k, rng)[0]

    def answer_many(
        self, Q: "Sequence[Sequence[float]] | np.ndarray", epsilon: float, sensitive_k: int | None = None, rng=None
    ) -> list[IdentifyAnswer]:
        """``answer`` for each row of Q; the answers cost len(Q) * epsilon in total."""
        _check_epsilon(epsilon)
        check_parameters(self.beta, sensitive_k)
        source = noise_source(rng)
        worst = probability_correct(epsilon, 1)
        out = []
        for nb in self.neighbourhoods(Q, sensitive_k):
            truth = is_anomaly(nb, self.beta, self.include_record)
            m = flip_distance(nb, self.beta, sensitive_k, self.include_record).m
            out.append(
                IdentifyAnswer(
                    value=randomized_answer(truth, m, epsilon, source),
                    epsilon=float(epsilon),
                    delta=0.0,
                    mechanism="identify_dp" if sensitive_k is None else "identify_sensitive",
                    sensitive_k=sensitive_k,
                    beta=self.beta,
                    radius=self.radius,
                    include_record=self.include_record,
                    probability_correct=worst,
                )
            )
        return out

    def probabilities_correct(
        self, Q: "Sequence[Sequence[float]] | np.ndarray", epsilon: float, sensitive_k: int | None = None
    ) -> np.ndarray:
        """Each query's true probability of a correct answer. NOT private (it reveals m): benchmarks only."""
        ms = [flip_distance(nb, self.beta, sensitive_k, self.include_record).m for nb in self.neighbourhoods(Q, sensitive_k)]
        return np.array([probability_correct(epsilon, m) for m in ms])

    def _queries(self, Q) -> np.ndarray:
        if not hasattr(self, "tree_"):
            raise RuntimeError("call fit() before querying")
        Q = np.asarray(Q, dtype=float)
        if Q.ndim == 1:
            Q = Q.reshape(1, -1)
        if Q.ndim != 2 or Q.shape[1] != self.n_features_in_ or not np.all(np.isfinite(Q)):
            raise ValueError(f"queries must be finite rows of {self.n_features_in_} scaled features, got shape {Q.shape}")
        return Q


def _check_epsilon(epsilon: float) -> None:
    if not (epsilon > 0 and math.isfinite(epsilon)):
        raise ValueError(f"epsilon must be a positive finite number, got {epsilon!r}")
