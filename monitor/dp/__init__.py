"""Privacy primitives shared by every private part: noise samplers, selection, the release type."""

from monitor.dp.noise import NoiseSource, noise_source
from monitor.dp.release import Release, laplace_accuracy, laplace_count

__all__ = ["NoiseSource", "noise_source", "Release", "laplace_accuracy", "laplace_count"]
