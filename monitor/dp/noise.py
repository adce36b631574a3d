"""Where the noise of every release comes from.

Production (``rng=None``): OpenDP's samplers, which draw from the operating system's
CSPRNG and are safe against the floating-point attacks on naive Laplace sampling
(Mironov 2012). Tests and reproducible benchmarks pass an explicit seed or
``numpy.random.Generator``; that path uses numpy's samplers of the same distributions
and is NOT for production: it is seedable, which is exactly what a release must not be.

>>> src = noise_source(7)          # seeded: for tests only
>>> src.seeded
True
>>> abs(src.laplace(1.0)) < 50
True
>>> noise_source(None).seeded      # OpenDP, OS randomness
False
"""

from __future__ import annotations

import math
import secrets
from functools import lru_cache
from typing import Sequence

import numpy as np

__all__ = ["NoiseSource", "noise_source", "RandomLike", "T_RELATIVE_ERROR"]

# Relative error bound of the production t sampler w.r.t. the exact ratio of the sampled
# Gaussians (each Gaussian modelled as exact, then rounded to the nearest float by OpenDP):
# 3 roundings to form Z_i / m, 1 square, dof - 1 additions, half of those under the sqrt
# plus 1, 1 product with fl(sqrt dof) (itself 1 rounding), 1 division. For dof <= 8 this is
# at most 16 unit roundoffs; we state 24 u to leave room for the caller's multiplication
# by the scale (1 more) and for libm's sqrt. See docs/privacy-count.md.
T_RELATIVE_ERROR = 24 * 2.0**-53

RandomLike = "None | int | np.random.Generator | NoiseSource"


@lru_cache(maxsize=1)
def _dp():
    import opendp.prelude as dp

    dp.enable_features("contrib")
    return dp


@lru_cache(maxsize=256)
def _opendp_vector_measurement(kind: str, scale: float):
    dp = _dp()
    domain = dp.vector_domain(dp.atom_domain(T=float, nan=False))
    if kind == "laplace":
        return dp.m.make_laplace(domain, dp.l1_distance(T=float), scale=scale)
    if kind == "gaussian":
        return dp.m.make_gaussian(domain, dp.l2_distance(T=float), scale=scale)
    raise ValueError(kind)


@lru_cache(maxsize=256)
def _opendp_discrete_laplace(scale: float):
    dp = _dp()
    domain = dp.vector_domain(dp.atom_domain(T="i64"))
    return dp.m.make_laplace(domain, dp.l1_distance(T="i64"), scale=scale)


@lru_cache(maxsize=256)
def _opendp_top_k(k: int, scale: float, monotonic: bool = False):
    dp = _dp()
    return dp.m.make_noisy_top_k(
        dp.vector_domain(dp.atom_domain(T=float, nan=False)),
        dp.linf_distance(T=float, monotonic=monotonic),
        dp.max_divergence(),
        k=k,
        scale=scale,
    )


class NoiseSource:
    """Samplers for the mechanisms of this package, from one source of randomness.

    Parameters
    ----------
    generator:
        ``None`` for production (OpenDP, OS randomness), or a seeded numpy
        ``Generator`` for tests and benchmarks.
    """

    def __init__(self, generator: np.random.Generator | None = None) -> None:
        self._seeded = generator is not None
        # Non-noise randomness (binomial counts, uniform positions of simulated cells)
        # comes from numpy; in production it is seeded from the OS CSPRNG.
        self.generator = generator if generator is not None else np.random.default_rng(secrets.randbits(128))

    @property
    def seeded(self) -> bool:
        """True when draws are reproducible (tests); never true in production."""
        return self._seeded

    # -- continuous noise -------------------------------------------------------------
    def laplace(self, scale: float, size: int | None = None, *, center: "float | np.ndarray" = 0.0) -> float | np.ndarray:
        """``center`` + Laplace(0, scale) draws: one float, or an array of ``size`` (or of
        ``center``'s length when it is an array).

        Pass the true value as ``center``: OpenDP then adds the noise itself, with the
        exact rounding that defeats floating-point attacks; adding our own float to its
        noise afterwards would give that up.
        """
        return self._continuous("laplace", scale, size, center)

    def gaussian(self, scale: float, size: int | None = None, *, center: "float | np.ndarray" = 0.0) -> float | np.ndarray:
        """``center`` + Normal(0, scale^2) draws (pass the true value as ``center``, as for laplace)."""
        return self._continuous("gaussian", scale, size, center)

    def _continuous(self, kind: str, scale: float, size: int | None, center) -> float | np.ndarray:
        _check_scale(scale)
        c = np.asarray(center, dtype=float)
        if not np.all(np.isfinite(c)):
            raise ValueError("center must be finite")
        n = 1 if size is None else int(size)
        if c.ndim:  # one true value per draw
            if size is not None and c.size != n:
                raise ValueError(f"center has {c.size} values but size is {n}")
            n = c.size
        values = np.broadcast_to(c.ravel() if c.ndim else c, (n,))
        if self._seeded:
            draw = self.generator.laplace if kind == "laplace" else self.generator.normal
            out = values + draw(0.0, scale, n)
        else:
            out = np.asarray(_opendp_vector_measurement(kind, float(scale))(values.tolist()), dtype=float)
        return float(out[0]) if size is None and not c.ndim else out

    def student_t(self, dof: int, scale: float, size: int | None = None) -> float | np.ndarray:
        """scale * T_dof draws, T_dof Student's t with an integer number of degrees of freedom.

        No DP library ships a t sampler; we build it from the library's Gaussians as
        T = Z_0 sqrt(dof) / sqrt(Z_1^2 + ... + Z_dof^2), which is exactly t-distributed.
        The ratio is ordinary float arithmetic, so a release must not add this draw to a
        true value and publish the float: ``monitor.outliers.mechanisms`` snaps it to a grid
        and charges the rounding (docs/privacy-count.md). The production path computes in
        the order that proof analyses: every Z is divided by m = max |Z_1..Z_dof| first
        (so nothing underflows or overflows in the squares), which keeps the result within
        a relative error of :data:`T_RELATIVE_ERROR` of the exact ratio of the sampled
        Gaussians (plus an absolute 2^-1070 when Z_0 / m underflows).
        """
        _check_scale(scale)
        if int(dof) != dof or dof < 1:
            raise ValueError(f"dof must be a positive integer, got {dof!r}")
        dof = int(dof)
        n = 1 if size is None else int(size)
        if self._seeded:
            out = scale * self.generator.standard_t(dof, n)
        else:
            out = scale * self._opendp_t(dof, n)
        return float(out[0]) if size is None else out

    def discrete_laplace(self, scale: float, size: int | None = None, *, center: "int | Sequence[int]" = 0) -> int | np.ndarray:
        """``center`` + discrete Laplace(scale) draws: integers z with P(z) proportional to exp(-|z| / scale).

        Integer in, integer out: no floating-point rounding anywhere, so comparisons of
        noisy integers (the sparse vector alarm) are exact. Production uses OpenDP's
        exact sampler; a shift of the centre by s changes every probability by at most
        exp(s / scale).
        """
        _check_scale(scale)
        c = np.asarray(center, dtype=np.int64)
        n = 1 if size is None else int(size)
        if c.ndim:
            if size is not None and c.size != n:
                raise ValueError(f"center has {c.size} values but size is {n}")
            n = c.size
        values = np.broadcast_to(c.ravel() if c.ndim else c, (n,)).astype(np.int64)
        if self._seeded:
            p = -math.expm1(-1.0 / scale)  # success probability of each geometric
            out = values + (self.generator.geometric(p, n) - self.generator.geometric(p, n))
        else:
            out = np.asarray(_opendp_discrete_laplace(float(scale))([int(v) for v in values]), dtype=np.int64)
        return int(out[0]) if size is None and not c.ndim else out

    def folded_discrete_laplace(self, scale: float) -> int:
        """|Z| for Z discrete Laplace(scale): a non-negative integer k with P(0) = (1 - q) / (1 + q)
        and P(k) = 2 (1 - q) q^k / (1 + q) for k >= 1, q = exp(-1 / scale).

        One-sided noise for the sparse vector alarm (``AboveThreshold``): its probabilities
        fall by at most exp(s / scale) from k to k + s for every k >= 0 and s >= 0, which is
        all that proof asks of a noise that is only ever shifted upwards. Drawn with the same
        exact integer sampler as :meth:`discrete_laplace`; the fold is exact.
        """
        return abs(int(self.discrete_laplace(scale)))

    def _opendp_t(self, dof: int, n: int) -> np.ndarray:
        z = self.gaussian(1.0, n * (dof + 1)).reshape(n, dof + 1)
        m = np.max(np.abs(z[:, 1:]), axis=1)
        while not np.all(m > 0):
            # All denominator draws exactly 0: probability ~0 and data-independent, redraw.
            bad = np.flatnonzero(~(m > 0))
            z[bad] = self.gaussian(1.0, bad.size * (dof + 1)).reshape(bad.size, dof + 1)
            m = np.max(np.abs(z[:, 1:]), axis=1)
        with np.errstate(over="ignore", under="ignore"):
            # Over- or underflow only in Z_0 / m (|Z_i / m| <= 1 otherwise): an infinite
            # draw keeps its sign, and the snapping clamps it to the end of the range.
            w = z / m[:, None]  # the largest denominator term becomes exactly +-1
            norm = np.sqrt(np.sum(w[:, 1:] ** 2, axis=1))  # in [1, sqrt(dof)]
            return (w[:, 0] * math.sqrt(dof)) / norm

    # -- selection ----------------------------------------------------------------------
    def top_k(self, scores: Sequence[float], k: int, scale: float, monotonic: bool = False) -> list[int]:
        """Indices of the k largest of ``scores + Exponential(scale)`` noise, best first.

        Report-noisy-max with exponential noise is permute-and-flip (McKenna & Sheldon
        2020): for scores of sensitivity Delta (in either direction) each pick is
        (2 Delta / scale)-DP, the same guarantee as the exponential mechanism with
        weights exp(score / scale), and never less accurate than it. k picks without
        replacement are (k * 2 Delta / scale)-DP. With ``monotonic`` (a neighbour moves
        every score in the same direction, e.g. counts under adding or removing one
        person) the factor 2 goes: (k Delta / scale)-DP. Production uses OpenDP's
        ``make_noisy_top_k`` (max-divergence), whose privacy map gives exactly that.
        """
        _check_scale(scale)
        scores = np.asarray(scores, dtype=float)
        if not 1 <= k <= scores.size:
            raise ValueError(f"k must be between 1 and the number of candidates ({scores.size}), got {k}")
        if not np.all(np.isfinite(scores)):
            raise ValueError("scores must be finite")
        if self._seeded:
            noisy = scores + self.generator.exponential(scale, scores.size)
            return [int(i) for i in np.argsort(-noisy, kind="stable")[:k]]
        return [int(i) for i in _opendp_top_k(int(k), float(scale), bool(monotonic))(scores.tolist())]


def _check_scale(scale: float) -> None:
    if not (scale > 0 and math.isfinite(scale)):
        raise ValueError(f"noise scale must be a positive finite number, got {scale!r}")


def noise_source(rng: "None | int | np.random.Generator | NoiseSource" = None) -> NoiseSource:
    """Normalise the ``rng`` argument every mechanism takes.

    ``None`` means production randomness (OpenDP, OS CSPRNG); an int or a Generator
    means a reproducible source for tests and benchmarks.
    """
    if isinstance(rng, NoiseSource):
        return rng
    if rng is None:
        return NoiseSource(None)
    if isinstance(rng, np.random.Generator):
        return NoiseSource(rng)
    if isinstance(rng, (int, np.integer)) and not isinstance(rng, bool):
        return NoiseSource(np.random.default_rng(int(rng)))
    raise TypeError(f"rng must be None, an int seed, a numpy Generator or a NoiseSource, not {type(rng).__name__}")
