"""GridKNN: the private grid-kNN outlier model (seed 001, Rauch et al.; DESIGN 2).

>>> import numpy as np
>>> X = np.random.default_rng(0).normal(50, 15, size=(2000, 2))
>>> m = GridKNN(epsilon=1.0, bounds=[(0, 100), (0, 100)], contamination=0.05, random_state=0).fit(X)
>>> s = m.score_samples([[50, 50], [95, 5]])
>>> bool(s[0] < s[1]), m.predict([[50, 50], [95, 5]]).tolist()
(True, [0, 1])
"""

from __future__ import annotations

import math
from typing import Sequence

import numpy as np

from monitor.dp import noise_source
from monitor.features import check_bounds, scale_to_unit
from monitor.model._defaults import default_layout, feature_groups
from monitor.model._grid import NoisyGrid, cell_threshold

__all__ = ["GridKNN"]

# Public size of the synthetic sample drawn from the model to set tau from contamination.
_N_SYNTHETIC = 20000
# Expected number of empty cells kept per grid by the threshold (DESIGN 2.3).
_FALSE_CELLS_DENSE = 0.05  # fraction of the grid, for small grids
_FALSE_CELLS_MAX = 1000.0


class GridKNN:
    """Private grid-kNN outlier model, fitted once under pure epsilon-DP.

    Parameters
    ----------
    bins, k, max_depth:
        Grid resolution per axis, noisy mass to reach, and L1 search depth (the paper's
        b, k, delta_max). ``None`` chooses from the number of features and epsilon only
        (``monitor.model.default_layout``).
    epsilon:
        Privacy budget of the whole fit (pure DP, delta = 0).
    bounds:
        Public (min, max) per feature, shape (d, 2). Values outside are clipped.
    weighted:
        Weighted kNN score (mass-weighted mean radius) instead of the basic one.
    contamination, threshold:
        ``predict`` flags score > threshold; if ``threshold`` is None it is the
        (1 - contamination) quantile of the scores of the model's own noisy mass.
    random_state:
        None = production noise (OpenDP); an int or Generator = reproducible (tests).
    feature_names:
        Names of the features, stored in the model file and checked at load.
    group_size:
        Features per grid; the d features are split into ceil(d / group_size) disjoint
        groups in their given order, each with its own grid and epsilon / n_grids.
    """

    def __init__(self, bins: int | None = None, k: float | None = None, epsilon: float = 1.0,
                 bounds: "Sequence[Sequence[float]] | np.ndarray | None" = None, max_depth: int | None = None,
                 weighted: bool = False, contamination: float | None = None, threshold: float | None = None,
                 random_state=None, feature_names: Sequence[str] | None = None, group_size: int | None = None):
        self.bins = bins
        self.k = k
        self.epsilon = epsilon
        self.bounds = bounds
        self.max_depth = max_depth
        self.weighted = weighted
        self.contamination = contamination
        self.threshold = threshold
        self.random_state = random_state
        self.feature_names = feature_names
        self.group_size = group_size

    # -- fitting --------------------------------------------------------------------------
    def _validate(self) -> None:
        if self.bounds is None:
            raise ValueError("bounds is required: public (min, max) per feature, never the data's own range")
        self.bounds_ = check_bounds(self.bounds)
        d = self.bounds_.shape[0]
        if not (isinstance(self.epsilon, (int, float)) and math.isfinite(self.epsilon) and self.epsilon > 0):
            raise ValueError(f"epsilon must be a positive finite number, got {self.epsilon!r}")
        for name, lo in (("bins", 2), ("max_depth", 0), ("group_size", 1)):
            v = getattr(self, name)
            if v is not None and (int(v) != v or v < lo):
                raise ValueError(f"{name} must be an integer >= {lo} or None, got {v!r}")
        if self.k is not None and not self.k > 0:
            raise ValueError(f"k must be positive or None, got {self.k!r}")
        if self.contamination is not None and not 0 < self.contamination < 0.5:
            raise ValueError(f"contamination must be in (0, 0.5), got {self.contamination!r}")
        if self.threshold is not None and not math.isfinite(self.threshold):
            raise ValueError(f"threshold must be finite, got {self.threshold!r}")
        names = self.feature_names
        if names is None:
            names = [f"x{i}" for i in range(d)]
        names = [str(n) for n in names]
        if len(names) != d or len(set(names)) != d:
            raise ValueError(f"feature_names must be {d} distinct names, got {names!r}")
        self.feature_names_ = names
        layout = default_layout(d, float(self.epsilon), self.group_size, self.bins, self.k, self.max_depth)
        self.group_size_, self.bins_, self.k_, self.max_depth_ = layout
        self.groups_ = feature_groups(d, self.group_size_)

    def fit(self, X, y=None) -> "GridKNN":
        """Fit the noisy grids on RAW reference features X (n, d); returns self.

        Guarantee: pure epsilon-DP for the reference data (add/remove one record). The
        features are scaled with the public ``bounds`` only; each of the G grids is
        epsilon/G-DP (Laplace(G/epsilon) on every cell, NoisyGrid.fit), and they compose
        sequentially to epsilon. Everything after (threshold, scores, the model file) is
        post-processing.
        """
        self._validate()
        U = scale_to_unit(X, self.bounds_)
        noise = noise_source(self.random_state)
        eps_grid = float(self.epsilon) / len(self.groups_)
        self.grids_ = []
        for g in self.groups_:
            n_cells = self.bins_ ** len(g)
            false_cells = min(_FALSE_CELLS_MAX, max(_FALSE_CELLS_DENSE * n_cells, 0.5)) if n_cells > 1 else 0.5
            theta = cell_threshold(n_cells, eps_grid, false_cells)
            self.grids_.append(NoisyGrid.fit(U, g, self.bins_, eps_grid, theta, noise))
        self.epsilon_spent_ = float(self.epsilon)
        self.n_features_in_ = U.shape[1]
        self.threshold_ = float(self.threshold) if self.threshold is not None else (
            self.threshold_for(float(self.contamination), noise.generator) if self.contamination is not None else None)
        return self

    def threshold_for(self, contamination: float, rng: "int | np.random.Generator | None" = 0) -> float:
        """Score threshold that flags a share ``contamination`` of the model's own noisy mass.

        The (1 - contamination) quantile of the scores of points drawn from the noisy
        grids: post-processing of the private model, free. ``rng`` only drives that
        public sampling (a fixed seed makes the threshold reproducible).

        >>> X = np.random.default_rng(0).normal(50, 15, size=(2000, 2))
        >>> m = GridKNN(epsilon=1.0, bounds=[(0, 100), (0, 100)], contamination=0.05, random_state=0).fit(X)
        >>> bool(m.threshold_for(0.01) > m.threshold_for(0.1))
        True
        """
        if not 0 < contamination < 1:
            raise ValueError(f"contamination must be in (0, 1), got {contamination!r}")
        self._check_fitted()
        return float(np.quantile(self._score_unit(self._synthetic(np.random.default_rng(rng))), 1.0 - contamination))

    def grid_scores(self, Y) -> np.ndarray:
        """Each grid's own score of RAW events Y: shape (n, number of grids). Post-processing, free."""
        self._check_fitted()
        return self._grid_scores_unit(scale_to_unit(Y, self.bounds_))

    def grid_thresholds(self, contamination: float, rng: "int | np.random.Generator | None" = 0) -> np.ndarray:
        """Per grid, the score threshold flagging ``contamination`` of the model's noisy mass (free)."""
        self._check_fitted()
        U = self._synthetic(np.random.default_rng(rng))
        return np.quantile(self._grid_scores_unit(U), 1.0 - contamination, axis=0)

    def _grid_scores_unit(self, U: np.ndarray) -> np.ndarray:
        if not len(U):
            return np.zeros((0, len(self.grids_)))
        return np.column_stack([g.score(U, self.k_, self.max_depth_, self.weighted) for g in self.grids_])

    def grid_names(self, feature_names: Sequence[str]) -> list[str]:
        """One name per grid: its features joined by '+'."""
        return ["+".join(feature_names[i] for i in g.features) for g in self.grids_]

    def _synthetic(self, gen: np.random.Generator) -> np.ndarray:
        """Points drawn from the noisy mass, in the unit cube.

        Each grid's kept cells are sampled in proportion to their noisy value, a point
        uniform in the cell; grids are sampled independently (their feature groups are
        disjoint). Post-processing of the released cells: free.
        """
        U = np.empty((_N_SYNTHETIC, self.n_features_in_))
        for grid in self.grids_:
            p = len(grid.features)
            if grid.values.size == 0:
                U[:, list(grid.features)] = gen.random((_N_SYNTHETIC, p))
                continue
            pick = gen.choice(grid.keys, size=_N_SYNTHETIC, p=grid.values / grid.values.sum())
            coords = (pick[:, None] // grid._strides[None, :]) % grid.bins
            U[:, list(grid.features)] = (coords + gen.random((_N_SYNTHETIC, p))) / grid.bins
        return U

    # -- scoring --------------------------------------------------------------------------
    def _check_fitted(self) -> None:
        if not hasattr(self, "grids_"):
            raise RuntimeError("this GridKNN is not fitted: call fit() or GridKNN.load()")

    def _score_unit(self, U: np.ndarray) -> np.ndarray:
        s = np.zeros(U.shape[0])
        for grid in self.grids_:
            s += grid.score(U, self.k_, self.max_depth_, self.weighted)
        return s / len(self.grids_)

    def score_samples(self, Y) -> np.ndarray:
        """Outlier scores of RAW events Y (n, d): higher = more outlying.

        Mean over the grids of Algorithm 1's score (unit-cube distance). Post-processing
        of the private model: no privacy cost for the reference data.
        """
        self._check_fitted()
        return self._score_unit(scale_to_unit(Y, self.bounds_))

    def predict(self, Y) -> np.ndarray:
        """1 = outlier (score > threshold_), 0 = inlier, per event."""
        self._check_fitted()
        if self.threshold_ is None:
            raise ValueError("no threshold: set threshold or contamination before fit")
        return (self.score_samples(Y) > self.threshold_).astype(np.int64)

    # -- persistence ----------------------------------------------------------------------
    def save(self, path) -> None:
        """Write the model file (versioned, checksummed JSON; no raw count)."""
        from monitor.model.file import save_model

        save_model(self, path)

    @classmethod
    def load(cls, path) -> "GridKNN":
        """Read a model file; raises ModelFileError if missing, corrupt or of another version."""
        from monitor.model.file import load_model

        return load_model(path)

    def check_features(self, names: Sequence[str], bounds) -> None:
        """Raise ModelFileError unless names and bounds equal the model's."""
        from monitor.model.file import check_features

        check_features(self, names, bounds)

