"""The immutable result of one private release, and the simplest mechanism that makes one."""

from __future__ import annotations

from dataclasses import dataclass

from monitor.dp.noise import NoiseSource, noise_source

__all__ = ["Release", "laplace_count"]


@dataclass(frozen=True)
class Release:
    """A released value with the guarantee it was released under.

    Only public things live here: the noisy value, its (epsilon, delta) and the name of
    the mechanism. Never the true value, never a data-dependent noise scale.
    """

    value: float
    epsilon: float
    delta: float
    mechanism: str

    def as_dict(self) -> dict:
        return {"value": self.value, "epsilon": self.epsilon, "delta": self.delta, "mechanism": self.mechanism}


def laplace_count(count: int, epsilon: float, sensitivity: float = 1.0, rng: "None | int | NoiseSource" = None) -> Release:
    """Release a count with Laplace noise of scale sensitivity/epsilon.

    Guarantee: pure epsilon-DP when one privacy unit changes the count by at most
    ``sensitivity``.

    >>> laplace_count(12, epsilon=1.0, rng=3).mechanism
    'laplace_global'
    """
    if not epsilon > 0:
        raise ValueError(f"epsilon must be positive, got {epsilon!r}")
    if not sensitivity > 0:
        raise ValueError(f"sensitivity must be positive, got {sensitivity!r}")
    value = noise_source(rng).laplace(sensitivity / epsilon, center=float(count))
    return Release(value=value, epsilon=float(epsilon), delta=0.0, mechanism="laplace_global")
