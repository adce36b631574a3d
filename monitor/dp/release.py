"""The immutable result of one private release, and the simplest mechanism that makes one."""

from __future__ import annotations

from dataclasses import dataclass, field

from monitor.dp.noise import NoiseSource, noise_source

__all__ = ["Release", "laplace_accuracy", "laplace_count"]

ACCURACY_ALPHA = 0.05  # ``accuracy`` is the half-width of the noise's 95 % interval


@dataclass(frozen=True)
class Release:
    """A released value with the guarantee it was released under.

    Only public things live here: the noisy value, its (epsilon, delta) and the name of
    the mechanism, and ``accuracy`` when the noise scale is public (a function of epsilon
    and a data-independent sensitivity): the value is within +-accuracy of the true one
    with probability 0.95. Never the true value, never a data-dependent noise scale
    (smooth-sensitivity releases have ``accuracy`` None: their scale follows the data).
    """

    value: float
    epsilon: float
    delta: float
    mechanism: str
    accuracy: float | None = field(default=None, kw_only=True)

    def as_dict(self) -> dict:
        return {"value": self.value, "epsilon": self.epsilon, "delta": self.delta, "mechanism": self.mechanism,
                "accuracy": self.accuracy}


def laplace_accuracy(scale: float) -> float:
    """Half-width of the 95 % interval of Laplace noise of this (public) scale (OpenDP's
    ``laplacian_scale_to_accuracy``: scale * ln 20).

    >>> round(laplace_accuracy(1.0), 3)
    2.996
    """
    from opendp.accuracy import laplacian_scale_to_accuracy

    return float(laplacian_scale_to_accuracy(float(scale), ACCURACY_ALPHA))


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
    scale = sensitivity / epsilon
    value = noise_source(rng).laplace(scale, center=float(count))
    return Release(value=value, epsilon=float(epsilon), delta=0.0, mechanism="laplace_global",
                   accuracy=laplace_accuracy(scale))
