"""Private outlier analysis (Okada et al.; docs/design.md#outlier-counts).

Distance-based outlier counts with a polynomial-time smooth sensitivity bound, their
private release, and the exponential mechanism for the top-h subspaces.

>>> import numpy as np
>>> from monitor.outliers import private_count, private_top_subspaces
>>> X = np.random.default_rng(0).random((500, 4))
>>> private_count(X, k=3, r=0.05, epsilon=1.0, delta=1e-6, rng=1).mechanism
'student_t_smooth_snapped'
>>> len(private_top_subspaces(X, k=3, r=0.05, h=2, epsilon=0.5, subspaces=1, rng=1))
2
"""

from monitor.outliers.mechanisms import (
    MECHANISMS,
    CountRelease,
    choose_mechanism,
    noise_std,
    paper_global_gaussian_count,
    private_count,
)
from monitor.outliers.sensitivity import (
    ParameterError,
    count_outliers,
    global_sensitivity_bound,
    kissing_number_bound,
    paper_global_sensitivity_lower_bound,
    smooth_sensitivity,
)
from monitor.outliers.subspaces import candidate_subspaces, private_top_subspace_counts, private_top_subspaces

__all__ = [
    "count_outliers",
    "smooth_sensitivity",
    "private_count",
    "CountRelease",
    "private_top_subspaces",
    "private_top_subspace_counts",
    "candidate_subspaces",
    "kissing_number_bound",
    "global_sensitivity_bound",
    "paper_global_sensitivity_lower_bound",
    "choose_mechanism",
    "paper_global_gaussian_count",
    "noise_std",
    "MECHANISMS",
    "ParameterError",
]
