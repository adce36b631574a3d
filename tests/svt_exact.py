"""Exact outcome probabilities of an AboveThreshold run, for the privacy tests.

A run's outcome is a sequence of answers; ``groups`` holds (x, positive, count): ``count``
queries at x = query - threshold (integer units) answered positive or negative. The
threshold noise rho is summed over exactly (to 60 of its scales), every query's noise in
closed form. Noises, as ``AboveThreshold`` draws them (``NoiseSource.folded_discrete_laplace``):
|Z| for Z discrete Laplace, P(z) proportional to exp(-|z| / scale). ``threshold_noise``
selects another threshold noise, to show that the checks see a noise the proof does not
cover: "laplace" (Z itself, two-sided) or "negated" (-|Z|, a lower tail only).
"""

from __future__ import annotations

import math

import numpy as np

__all__ = ["log_prob", "log_tail"]


def log_tail(a: np.ndarray, t: float) -> np.ndarray:
    """log P(|Z| >= a), t = 1 / scale: 0 for a <= 0, log(2 q^a / (1 + q)) for a >= 1, q = exp(-t)."""
    a = np.asarray(a)
    return np.where(a >= 1, math.log(2.0) - t * np.maximum(a, 1) - math.log1p(math.exp(-t)), 0.0)


def _threshold_log_pmf(scale: float, kind: str) -> tuple[np.ndarray, np.ndarray]:
    t = 1.0 / scale
    reach = int(60 * scale)
    log_zero = math.log(math.tanh(t / 2))  # P(Z = 0) = (1 - q) / (1 + q)
    if kind == "laplace":
        rho = np.arange(-reach, reach + 1)
        return rho, log_zero - t * np.abs(rho)
    k = np.arange(0, reach + 1)
    log_p = np.where(k == 0, log_zero, log_zero + math.log(2.0) - t * k)
    if kind == "folded":
        return k, log_p
    if kind == "negated":
        return -k, log_p
    raise ValueError(kind)


def log_prob(groups, scale_t: float, scale_q: float, threshold_noise: str = "folded") -> float:
    """Exact log P[outcome] of an AboveThreshold run (see the module docstring)."""
    t_q = 1.0 / scale_q
    rho, log_p = _threshold_log_pmf(scale_t, threshold_noise)
    with np.errstate(divide="ignore"):
        for x, positive, count in groups:
            up = log_tail(rho - x, t_q)  # the query's noise must reach rho - x
            log_p = log_p + count * (up if positive else np.log(-np.expm1(up)))
    top = log_p.max()
    if not np.isfinite(top):
        return -math.inf
    return float(top + math.log(np.exp(log_p - top).sum()))
