"""Calibrated flag rates: a private histogram of scores on reference rows the grids never saw.

A contamination rate c should mean "flag a share c of the user's normal data". The grids'
own noisy mass cannot say that (on the shared benchmarks a nominal 1 % flagged 0 % to 51 %
of unseen normal events; docs/model.md), so ``GridKNN.fit`` holds a part of the reference rows
apart from the grids (``split_rows``: disjoint records, parallel composition) and releases
the distribution of the model's scores on that part here: a noisy histogram over PUBLIC
score bins (``score_edges``). Every rate is then post-processing of that histogram:
``ScoreHistogram.share_above(t)`` (the calibrated share of normal data with score > t, for
any t) and ``ScoreHistogram.threshold_for(c)`` (its inverse).

>>> import numpy as np
>>> from monitor.dp import noise_source
>>> edges = public_edges(3.0, np.random.default_rng(1).gamma(4.0, 0.3, 20000))
>>> s = np.random.default_rng(0).gamma(4.0, 0.25, 5000)           # scores of held-apart rows
>>> h = ScoreHistogram.release(s, edges, epsilon=1.0, noise=noise_source(0))
>>> t = h.threshold_for(0.05)
>>> abs(float((s > t).mean()) - 0.05) < 0.01
True
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from monitor.dp import NoiseSource

__all__ = ["Calibration", "RateAccuracy", "ScoreHistogram", "score_edges", "public_edges", "split_rows", "laplace_sum_accuracy", "N_BINS"]

# Public score binning. A tail count over j bins carries noise of standard deviation
# sqrt(2 j) / epsilon, so the bins must be few above the thresholds that matter (the top
# 0.1 % to 50 % of normal scores) and fine around them. Where those scores lie is read from
# the grids themselves (public once released): quantiles of the scores of a synthetic
# sample drawn from the noisy grids at TAIL_PROBS, plus COARSE_BINS bins uniform in
# sqrt(score) over the whole range, which keep a resolution where the synthetic sample is
# wrong (it put the 1 % quantile anywhere from the real 0.05 % to the real 20 %).
# Measured on the shared sets (bench/bench_calibration.py --sweep).
TAIL_PROBS = tuple(np.geomspace(0.5, 0.0005, 8).tolist())
COARSE_BINS = 8
N_BINS = COARSE_BINS  # (sqrt-uniform bins of ``score_edges``)
_POWER = 0.5
# Rare shares are not countable on a small part: 0.2 % of 600 held-apart rows is 1.2 rows under a
# tail noise of about +-10, and the counted threshold landed anywhere from the real 0 % to 0.7 %
# (0 on 11 of 18 fits of the shared sets). Above the highest edge whose tail count is at least
# TAIL_TRUST times its 95 % noise bound, the tail is an exponential fitted to the noisy bins there
# (``ScoreHistogram.tail_``). 3 did as well as any of 1.5 to 4 on those fits; bench/bench_calibration.py's
# rare-rate table measures it on every shared set.
TAIL_TRUST = 3.0
_TAIL_SCALES = np.geomspace(1e-3, 10.0, 400)  # the fit's grid of decay lengths, times the score range
_BODY_SPAN = 5.0  # the trusted edges whose tail count is within this factor of the anchor's


def score_edges(score_max: float, n_bins: int | None = None) -> np.ndarray:
    """Public bin edges over [0, score_max], uniform in sqrt(score); n_bins + 1 of them.

    Depends on public settings only (the score's largest value follows from the grids'
    depth and dimension).

    >>> score_edges(4.0, 4).tolist()
    [0.0, 0.25, 1.0, 2.25, 4.0]
    """
    if not (score_max > 0 and math.isfinite(score_max)):
        raise ValueError(f"score_max must be a positive finite number, got {score_max!r}")
    n_bins = N_BINS if n_bins is None else int(n_bins)
    return (np.linspace(0.0, 1.0, n_bins + 1) ** (1.0 / _POWER)) * float(score_max)


def public_edges(score_max: float, public_scores: np.ndarray | None = None) -> np.ndarray:
    """Bin edges from public things only: ``score_edges(score_max)`` merged with the
    (1 - q) quantiles, q in TAIL_PROBS, of ``public_scores`` (scores of a sample drawn from
    the released grids with a fixed seed: post-processing, never the held-apart rows).
    Edges closer than 1e-6 of the range are merged. Bin i holds scores in
    [edges[i], edges[i + 1]); the first bin also holds anything below edges[0] and the last
    anything at or above edges[-1], so every score falls in exactly one bin.

    >>> e = public_edges(4.0, np.linspace(0, 2, 1001))
    >>> bool(e[0] == 0.0 and e[-1] == 4.0 and np.all(np.diff(e) > 0)), len(e)  # 8 + 1 fixed, 8 quantiles, less 1 merged
    (True, 16)
    """
    edges = score_edges(score_max)
    if public_scores is not None and len(public_scores):
        q = np.quantile(np.asarray(public_scores, dtype=float), 1.0 - np.asarray(TAIL_PROBS))
        edges = np.concatenate([edges, np.clip(q, 0.0, score_max)])
    edges = np.unique(edges)
    keep = np.r_[True, np.diff(edges) > 1e-6 * score_max]
    edges = edges[keep]
    edges[-1] = max(edges[-1], score_max)
    return edges


def bin_index(scores: np.ndarray, edges: np.ndarray) -> np.ndarray:
    """Bin of each score: i with edges[i] <= s < edges[i + 1]; below the first edge -> 0, at or
    above the last -> the last bin. A score exactly on an edge goes to the bin that starts there."""
    idx = np.searchsorted(edges, np.asarray(scores, dtype=float), side="right") - 1
    return np.clip(idx, 0, len(edges) - 2)


def laplace_sum_accuracy(j: int, scale: float) -> float:
    """95 % bound on |sum of j independent Laplace(scale)|: ln(20) scale for one term (exact),
    2.1 sqrt(2 j) scale for more (above the simulated 95 % quantile for every j checked, 2 to 4096;
    tests/test_calibration.py). Post-processing of public parameters."""
    if j <= 0:
        return 0.0
    return float(scale * max(math.log(20.0), 2.1 * math.sqrt(2.0 * j)))


@dataclass(frozen=True)
class ScoreHistogram:
    """A released noisy histogram of scores over public ``edges`` and what follows from it.

    ``counts`` are the noisy counts (never a true one), ``epsilon`` the budget of the release
    (Laplace scale 1 / epsilon per bin). Everything else is post-processing: the tail
    counts are made non-increasing (pool adjacent violators), clipped to [0, total], and
    interpolated linearly inside a bin, which gives the calibrated share above any t.

    ``prior`` (optional, public): the share of a public sample (scores of points drawn from
    the released grids) at or above each edge. It enters the shares as ``prior_rows``
    pseudo-rows, as many as the 95 % bound of the noise on the histogram's total: on a
    large held-apart part it is negligible, on a tiny one (where the noise is most of what
    the histogram holds) the shares lean on the grids' own distribution instead of on noise.
    Post-processing of public things: free.

    ``tail_`` (derived, post-processing): where counting stops telling shares apart, an
    exponential tail. From the highest edge e_a whose tail count is at least ``TAIL_TRUST``
    times its noise bound (``rank_accuracy``), the count above t > e_a is N_a exp(-(t - e_a) / s),
    with N_a the count at e_a and s the maximum-likelihood decay given the noisy counts of the
    bins above e_a (Laplace noise, so least absolute deviations; on a grid of s), combined
    (geometric mean) with the decay of the counted tail over the trusted edges below e_a: two
    estimates with independent errors (on 18 fits of the alarm's shared sets, the realised
    share at a nominal 0.5 % had a root-mean-square log error of 0.74 with both, 0.94 with the
    bins' fit alone, 0.83 with the slope alone). Why a model there: the counts above e_a are
    mostly noise, and the isotonic tail reads that noise as rows, which put rare thresholds at
    the top of the score range (flagging none of the normal data, and no outliers either). Why
    an exponential: one parameter, extrapolated from where the counts are trusted; on those
    fits the median realised share was 0.91 of a nominal 0.2 % and 1.08 of 0.5 % (0 and 0.33
    counted). None where the histogram is too small to trust any edge, or where every edge is
    trusted.
    """

    edges: np.ndarray
    counts: np.ndarray
    epsilon: float
    prior: np.ndarray | None = None

    @classmethod
    def release(cls, scores: np.ndarray, edges: np.ndarray, epsilon: float, noise: NoiseSource,
                public_scores: np.ndarray | None = None) -> "ScoreHistogram":
        """Release the histogram of ``scores`` over ``edges`` with Laplace(1 / epsilon) per bin.

        Guarantee: pure epsilon-DP for add/remove one row of the data the scores come from,
        when the score function itself does not depend on those rows (here: the grids are
        fitted on the other part of the reference). One row adds 1 to exactly one bin
        (``bin_index`` puts every float, edge values included, in one bin): L1 sensitivity 1,
        and every bin, empty or not, gets its own noise draw through ``noise`` (OpenDP in
        production). The bins are public, so the output's shape reveals nothing.
        ``public_scores`` (never the private rows) set the public ``prior``.
        """
        if not (epsilon > 0 and math.isfinite(epsilon)):
            raise ValueError(f"epsilon must be a positive finite number, got {epsilon!r}")
        edges = np.asarray(edges, dtype=float)
        true = np.bincount(bin_index(scores, edges), minlength=len(edges) - 1).astype(float)
        noisy = np.asarray(noise.laplace(1.0 / epsilon, center=true), dtype=float).reshape(-1)
        prior = None
        if public_scores is not None and len(public_scores):
            ps = np.sort(np.asarray(public_scores, dtype=float))
            prior = 1.0 - np.searchsorted(ps, edges, side="left") / ps.size  # share at or above each edge
            prior[0] = 1.0  # the first bin holds everything below its edge too
        return cls(edges, noisy, float(epsilon), prior)

    def __post_init__(self) -> None:
        edges = np.asarray(self.edges, dtype=float)
        counts = np.asarray(self.counts, dtype=float)
        if edges.ndim != 1 or counts.shape != (edges.size - 1,) or edges.size < 2:
            raise ValueError("a score histogram needs n + 1 edges for n counts")
        if np.any(np.diff(edges) <= 0) or not np.all(np.isfinite(edges)) or not np.all(np.isfinite(counts)):
            raise ValueError("histogram edges must be finite and increasing, counts finite")
        object.__setattr__(self, "edges", edges)
        object.__setattr__(self, "counts", counts)
        tail = np.concatenate([np.cumsum(counts[::-1])[::-1], [0.0]])  # noisy count at or above each edge
        tail = np.clip(_decreasing(tail), 0.0, None)
        tail[-1] = 0.0
        object.__setattr__(self, "_tail", tail)
        blend = tail
        if self.prior is not None:
            prior = np.asarray(self.prior, dtype=float)
            if prior.shape != edges.shape or not np.all(np.isfinite(prior)) or np.any(np.diff(prior) > 0):
                raise ValueError("a histogram's prior must be one non-increasing share per edge")
            object.__setattr__(self, "prior", prior)
            blend = tail + self.prior_rows * prior
        object.__setattr__(self, "_blend", blend)
        object.__setattr__(self, "tail_", self._fit_tail())

    def _fit_tail(self) -> "tuple[int, float] | None":
        """(a, s): the anchor edge's index and the fitted decay (see the class docstring)."""
        k = len(self.counts)
        acc = np.array([self.rank_accuracy(e) for e in self.edges[:k]])
        trusted = np.flatnonzero(self._tail[:k] >= TAIL_TRUST * acc)
        if trusted.size == 0 or trusted[-1] >= k - 1:
            return None
        a = int(trusted[-1])
        x = self.edges[a:] - self.edges[a]
        s = _TAIL_SCALES * float(self.edges[-1] - self.edges[0])
        above = self._tail[a] * np.exp(-x[None, :] / s[:, None])  # count above each edge, per s
        expected = above[:, :-1] - np.concatenate([above[:, 1:-1], np.zeros((s.size, 1))], axis=1)
        loss = np.abs(self.counts[a:][None, :] - expected).sum(axis=1)
        fitted = float(s[int(np.argmin(loss))])
        # The trusted edges just below e_a say how fast the tail falls where it is still counted.
        body = [i for i in range(a + 1) if 0 < self._tail[i] <= _BODY_SPAN * self._tail[a]]
        if len(body) < 2:
            return a, fitted
        slope = float(np.polyfit(self.edges[body], np.log(self._tail[body]), 1)[0])
        return (a, math.sqrt(fitted / -slope)) if slope < 0 else (a, fitted)

    @property
    def prior_rows(self) -> float:
        """Pseudo-rows the public prior counts for: the 95 % noise bound of the total (0 without one)."""
        return 0.0 if self.prior is None else laplace_sum_accuracy(len(self.counts), self.scale)

    @property
    def scale(self) -> float:
        return 1.0 / self.epsilon

    @property
    def total(self) -> float:
        """The noisy number of scored rows (the tail at the first edge), at least 0."""
        return float(self._tail[0])

    def count_above(self, t) -> np.ndarray | float:
        """Calibrated (noisy) number of rows scoring above t, prior pseudo-rows included;
        vectorised, non-increasing in t."""
        t = np.asarray(t, dtype=float)
        out = np.interp(t, self.edges, self._blend)
        if self.tail_ is not None:
            a, s = self.tail_
            with np.errstate(over="ignore"):
                model = self._blend[a] * np.exp(-(t - self.edges[a]) / s)
            # Nothing scores at or above the last edge (the score's largest value).
            out = np.where((t > self.edges[a]) & (t < self.edges[-1]), model, out)
        return float(out) if np.ndim(out) == 0 else out

    def share_above(self, t) -> np.ndarray | float:
        """Calibrated share of normal rows scoring above t (0 when there is nothing to go by).
        Post-processing of the release; vectorised."""
        tot = float(self._blend[0])
        c = self.count_above(t)
        return c / tot if tot > 0 else c * 0.0

    def threshold_for(self, share: float) -> float:
        """Smallest score t whose calibrated share above t is at most ``share``: the
        (1 - share) quantile of the released distribution. Post-processing, a few
        microseconds (an interpolation over the edges)."""
        if not 0 < share < 1:
            raise ValueError(f"share must be in (0, 1), got {share!r}")
        tail = self._blend
        target = share * float(tail[0])
        if tail[0] <= 0:
            return float(self.edges[-1])
        if self.tail_ is not None and target < tail[self.tail_[0]]:
            a, s = self.tail_
            return float(min(self.edges[a] + s * math.log(tail[a] / target), self.edges[-1]))
        i = int(np.searchsorted(-tail, -target, side="left"))  # first edge with tail <= target
        if i == 0:
            return float(self.edges[0])
        t0, t1, c0, c1 = self.edges[i - 1], self.edges[i], tail[i - 1], tail[i]
        return float(t1 if c0 == c1 else t0 + (c0 - target) / (c0 - c1) * (t1 - t0))

    def rank_accuracy(self, t: float) -> float:
        """95 % bound on the noise in ``count_above(t)``: the Laplace noise of the bins above t
        (the partial bin counted whole). Post-processing of public parameters and t."""
        j = len(self.counts) - int(bin_index([t], self.edges)[0])
        return laplace_sum_accuracy(j, self.scale)

    def as_dict(self) -> dict:
        # "values", as the grids' noisy cells: the file holds no field named like a raw count
        return {"edges": self.edges.tolist(), "values": self.counts.tolist(), "epsilon": self.epsilon,
                "mechanism": "laplace_histogram", "prior": None if self.prior is None else self.prior.tolist()}

    @classmethod
    def from_dict(cls, d: dict) -> "ScoreHistogram":
        prior = d.get("prior")
        return cls(np.asarray(d["edges"], dtype=float), np.asarray(d["values"], dtype=float), float(d["epsilon"]),
                   None if prior is None else np.asarray(prior, dtype=float))


def _decreasing(y: np.ndarray) -> np.ndarray:
    """Least-squares non-increasing fit to y (pool adjacent violators): the tail counts of a
    distribution never grow with t, and pooling keeps them unbiased where noise broke that."""
    vals: list[float] = []
    sizes: list[int] = []
    for v in y.tolist():
        vals.append(v)
        sizes.append(1)
        while len(vals) > 1 and vals[-2] < vals[-1]:
            s = sizes[-2] + sizes[-1]
            vals[-2] = (vals[-2] * sizes[-2] + vals[-1] * sizes[-1]) / s
            sizes[-2] = s
            vals.pop()
            sizes.pop()
    return np.repeat(vals, sizes)


_SPLIT_MIX = (0x9E3779B97F4A7C15, 0xBF58476D1CE4E5B9, 0x94D049BB133111EB)


def split_rows(X: np.ndarray, share: float, seed: int) -> np.ndarray:
    """Boolean mask: True for the rows held apart for calibration, False for the grids' rows.

    Each row's part is a hash (splitmix64, PUBLIC ``seed``) of its own float64 values and
    of its occurrence number among identical rows (0 for the first copy, 1 for the
    second, ...), never of its position or of other rows' values. Adding or removing one
    row therefore changes the rows of one part by exactly one row and leaves the other
    part's as they were (the multiset of (row, occurrence) pairs changes by that one pair),
    which is what parallel composition needs. With duplicates, removing one copy renumbers
    the later copies and one of them may change part, but it is identical to the copy it
    replaces, so each part's multiset of rows changes only as said. Identical rows are split like
    distinct ones (hashing values alone would send every copy to one part). About
    ``share`` of the rows are held apart.
    """
    if not 0 <= share < 1:
        raise ValueError(f"calibration share must be in [0, 1), got {share!r}")
    X = np.ascontiguousarray(np.asarray(X, dtype=np.float64) + 0.0)  # + 0.0: -0.0 hashes as 0.0
    n = X.shape[0]
    if share == 0 or n == 0:
        return np.zeros(n, dtype=bool)
    bits = X.view(np.uint64).reshape(n, -1)
    _, inv = np.unique(bits, axis=0, return_inverse=True)
    inv = inv.reshape(-1)
    order = np.argsort(inv, kind="stable")
    sorted_inv = inv[order]
    starts = np.flatnonzero(np.r_[True, sorted_inv[1:] != sorted_inv[:-1]])
    occ = np.empty(n, dtype=np.uint64)
    occ[order] = (np.arange(n) - np.repeat(starts, np.diff(np.r_[starts, n]))).astype(np.uint64)
    with np.errstate(over="ignore"):
        h = np.full(n, np.uint64(seed & 0xFFFFFFFFFFFFFFFF) ^ np.uint64(_SPLIT_MIX[0]), dtype=np.uint64)
        for col in (*bits.T, occ):
            h = _mix(h ^ col)
        h = _mix(h + np.uint64(_SPLIT_MIX[0]))
    return (h >> np.uint64(11)).astype(np.float64) / float(1 << 53) < share


def _mix(z: np.ndarray) -> np.ndarray:
    z = (z ^ (z >> np.uint64(30))) * np.uint64(_SPLIT_MIX[1])
    z = (z ^ (z >> np.uint64(27))) * np.uint64(_SPLIT_MIX[2])
    return z ^ (z >> np.uint64(31))


@dataclass(frozen=True)
class Calibration:
    """What ``GridKNN.fit`` released on the held-apart rows: the histogram of the model's
    score (``score``) and one per grid (``grids``), with the public split that defined the
    part (``share`` of the rows, hash ``seed``). A one-grid model's grid score IS the model's
    score, so its one grid histogram is ``score`` itself: one release, counted once in
    ``epsilon`` and written once (``"grids": []`` in the file, as before)."""

    share: float
    seed: int
    score: ScoreHistogram
    grids: list

    @property
    def epsilon(self) -> float:
        return float(self.score.epsilon + sum(h.epsilon for h in self.grids if h is not self.score))

    def accuracy(self, rate: float) -> "RateAccuracy":
        """How well the held-apart part pins down a flag rate (post-processing)."""
        t = self.score.threshold_for(rate)
        m = self.score.total
        alpha = self.score.rank_accuracy(t)
        expected = rate * m
        # The realised count above t misses rate * m by the noise (alpha, 95 %) and by the
        # sampling spread of m rows (about 2 sqrt(rate m) for 95 %), independent errors that
        # add in quadrature; within half of rate * m the unseen rate stays inside
        # [rate / 2, 2 rate].
        enough = expected > 0 and math.hypot(alpha, 2.0 * math.sqrt(expected)) <= 0.5 * expected
        return RateAccuracy(rate, t, m, alpha, enough)

    def as_dict(self) -> dict:
        return {"share": self.share, "seed": self.seed, "epsilon": self.epsilon,
                "mechanism": "laplace_histogram", "unit": "one reference record in the held-apart part",
                "score": self.score.as_dict(), "grids": [h.as_dict() for h in self.grids if h is not self.score]}

    @classmethod
    def from_dict(cls, d: dict) -> "Calibration":
        share = float(d["share"])
        if not 0 < share < 1:
            raise ValueError("calibration.share must be in (0, 1)")
        score = ScoreHistogram.from_dict(d["score"])
        # No grid histograms: a one-grid model's (the loader refuses them for more grids).
        return cls(share, int(d["seed"]), score, [ScoreHistogram.from_dict(g) for g in d["grids"]] or [score])


@dataclass(frozen=True)
class RateAccuracy:
    """A rate's calibrated threshold and how far to trust it: ``rows`` is the noisy size of
    the held-apart part, ``rank_accuracy`` the 95 % bound of the noise in the count of rows
    above ``threshold`` (to compare with ``rate * rows``), ``enough`` whether the part is
    large enough for the rate to land within [rate / 2, 2 rate] on unseen normal data."""

    rate: float
    threshold: float
    rows: float
    rank_accuracy: float
    enough: bool

    @property
    def rows_needed(self) -> float:
        """Held-apart rows at which ``enough`` would hold at this noise: the smallest x = rate *
        rows with alpha^2 + 4 x <= x^2 / 4, i.e. x = 8 + sqrt(64 + 4 alpha^2)."""
        return (8.0 + math.sqrt(64.0 + 4.0 * self.rank_accuracy ** 2)) / self.rate
