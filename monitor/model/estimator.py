"""GridKNN: the private grid-kNN outlier model (Rauch et al.; docs/design.md#the-model).

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
from monitor.model._defaults import DEFAULT_RULE, RULES, SCORE_POWER, SIZE_SHARE, check_score_power, default_layout
from monitor.model._format import check_features, read_model, save_model
from monitor.model._grid import NoisyGrid, cell_threshold
from monitor.model.calibration import Calibration, ScoreHistogram, public_edges, split_rows

__all__ = ["GridKNN", "LEGACY_OPTIONS"]

# The layout rule before the tail rule (format 4's first default), for comparison: bench/bench_model_tail.py.
LEGACY_OPTIONS = {"layout_rule": "v4"}

# Public size and seed of the synthetic sample drawn from the model to set tau from contamination.
_N_SYNTHETIC = 20000
_SYNTHETIC_SEED = 0
# Expected number of empty cells kept per grid by the threshold (docs/design.md#the-model).
_FALSE_CELLS_DENSE = 0.5  # of the grid: theta = 0 for dense grids, keep every positive noisy value
_FALSE_CELLS_MAX = 1000.0
# Calibration (docs/model.md "Calibrated flags"). Share of the reference rows held
# apart from the grids, chosen on the shared sets (bench/bench_calibration.py): more rows
# make rarer rates calibratable, fewer grid rows cost AUROC.
CALIBRATION_SHARE = 0.25
SPLIT_SEED = 0  # public seed of the row split
# Share of the held-apart part's epsilon for the histogram of the model's score (what
# ``predict`` and the alarm use); the rest is split equally over the per-grid histograms.
SCORE_HISTOGRAM_SHARE = 0.75
PRIOR = True  # lean on the grids' own score distribution where the held-apart part is tiny


class GridKNN:
    """Private grid-kNN outlier model, fitted once under pure epsilon-DP.

    Parameters
    ----------
    bins, k, max_depth:
        Bins per axis of the joint grids, noisy mass to reach, and L1 search depth (the
        paper's b, k, delta_max). ``None`` chooses from d, epsilon and a private estimate
        of the number of reference records (``monitor.model.default_layout``, docs/model.md).
    epsilon:
        Privacy budget of the whole fit (pure DP, delta = 0): a share SIZE_SHARE for the
        size estimate, the rest split equally over the grids on the grids' rows, and the
        same rest over the score histograms on the held-apart rows (parallel composition).
    bounds:
        Public (min, max) per feature, shape (d, 2). Values outside are clipped.
    weighted:
        Weighted kNN score (mass-weighted mean radius) instead of the basic one.
    contamination, threshold:
        ``predict`` flags score > threshold; if ``threshold`` is None it is the calibrated
        (1 - contamination) quantile of the scores of reference rows held apart from the
        grids (``calibration_share``), so about ``contamination`` of the user's normal data
        is flagged. Both are post-processing: ``set_threshold`` changes them after fit.
    calibration_share:
        Share of the reference rows held apart from the grids to calibrate rates (split by
        a hash with a public seed; parallel composition, no extra epsilon). 0 = no
        calibration: rates are then quantiles of the model's own noisy mass (uncalibrated,
        the behaviour of model files before version 4).
    random_state:
        None = production noise (OpenDP); an int or Generator = reproducible (tests).
    feature_names:
        Names of the features, stored in the model file and checked at load.
    group_size, n_grids, marginals:
        Features per joint grid, number of joint grids, and number of fine 1-feature
        grids; ``None`` = the default rule.
    layout_rule:
        "tail" (default: k without a sqrt(n) term, one fine joint grid for 2 to 4 features
        where the noisy size allows) or "v4" (the rule before it); docs/model.md.
    score_power:
        p of the power mean over the grids' scores, (mean s_i^p)^(1/p), that is the model's
        score: 1 the arithmetic mean (model files before it), 1.5 the default (SCORE_POWER).
    """

    def __init__(self, bins: int | None = None, k: float | None = None, epsilon: float = 1.0,
                 bounds: "Sequence[Sequence[float]] | np.ndarray | None" = None, max_depth: int | None = None,
                 weighted: bool = False, contamination: float | None = None, threshold: float | None = None,
                 random_state=None, feature_names: Sequence[str] | None = None, group_size: int | None = None,
                 n_grids: int | None = None, marginals: int | None = None,
                 calibration_share: float = CALIBRATION_SHARE, layout_rule: str = DEFAULT_RULE,
                 score_power: float = SCORE_POWER):
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
        self.n_grids = n_grids
        self.marginals = marginals
        self.calibration_share = calibration_share
        self.layout_rule = layout_rule
        self.score_power = score_power

    # -- fitting --------------------------------------------------------------------------
    def _validate(self) -> None:
        if self.bounds is None:
            raise ValueError("bounds is required: public (min, max) per feature, never the data's own range")
        self.bounds_ = check_bounds(self.bounds)
        d = self.bounds_.shape[0]
        if not (isinstance(self.epsilon, (int, float)) and math.isfinite(self.epsilon) and self.epsilon > 0):
            raise ValueError(f"epsilon must be a positive finite number, got {self.epsilon!r}")
        for name, lo in (("bins", 2), ("max_depth", 0), ("group_size", 1), ("n_grids", 1), ("marginals", 0)):
            v = getattr(self, name)
            if v is not None and (int(v) != v or v < lo):
                raise ValueError(f"{name} must be an integer >= {lo} or None, got {v!r}")
        if self.k is not None and not self.k > 0:
            raise ValueError(f"k must be positive or None, got {self.k!r}")
        _check_postprocessing(self.contamination, self.threshold)
        if self.layout_rule not in RULES:
            raise ValueError(f"layout_rule must be one of {RULES}, got {self.layout_rule!r}")
        check_score_power(self.score_power)
        cs = self.calibration_share
        if not (isinstance(cs, (int, float)) and 0 <= cs <= 0.9):
            raise ValueError(f"calibration_share must be a number in [0, 0.9], got {cs!r}")
        names = self.feature_names
        if names is None:
            names = [f"x{i}" for i in range(d)]
        names = [str(n) for n in names]
        if len(names) != d or len(set(names)) != d:
            raise ValueError(f"feature_names must be {d} distinct names, got {names!r}")
        self.feature_names_ = names

    def _set_layout(self, n_estimate: float, epsilon_grids: float) -> None:
        """The layout from public settings and the (private) size estimate: post-processing."""
        layout = default_layout(self.bounds_.shape[0], epsilon_grids, n_estimate, self.group_size, self.bins, self.k,
                                self.max_depth, self.n_grids, self.marginals, rule=self.layout_rule)
        self.groups_, self.grid_bins_, self.k_, self.max_depth_ = layout

    def fit(self, X, y=None) -> "GridKNN":
        """Fit the noisy grids on RAW reference features X (n, d); returns self.

        Guarantee: pure epsilon-DP for the reference data (add/remove one record). The
        features are scaled with the public ``bounds`` only. First the number of records
        is released with Laplace(1 / epsilon_size) noise, epsilon_size = SIZE_SHARE *
        epsilon (a count: sensitivity 1). The rows are then split into two disjoint parts
        by ``calibration.split_rows`` (a hash of each row with a public seed, so one
        record's presence changes one part by exactly that row): the grids' part and the held-apart part
        (``calibration_share`` of the rows).
        - Grids' part: the layout is a function of the size release and of public
          settings (post-processing); each of the G grids is (epsilon - epsilon_size)/G-DP
          (Laplace noise on every cell, NoisyGrid.fit): epsilon in all with the size.
        - Held-apart part: the model's scores of its rows (the score function depends only
          on the grids, i.e. on the OTHER part) go into noisy histograms over public bins
          (``ScoreHistogram.release``, sensitivity 1 each): SCORE_HISTOGRAM_SHARE of
          (epsilon - epsilon_size) for the model's score, the rest split over one
          histogram per grid: epsilon in all with the size.
        A record is in one part only, so the fit is epsilon-DP (parallel composition of
        the two parts after the shared size release). Everything after (thresholds,
        shares, scores, the model file) is post-processing.
        """
        self._validate()
        U = scale_to_unit(X, self.bounds_)
        noise = noise_source(self.random_state)
        self.size_epsilon_ = SIZE_SHARE * float(self.epsilon)
        self.n_estimate_ = float(noise.laplace(1.0 / self.size_epsilon_, center=float(U.shape[0])))
        share = float(self.calibration_share)
        held = split_rows(U, share, SPLIT_SEED)
        self.calibration_share_ = share
        eps_grids = float(self.epsilon) - self.size_epsilon_
        self._set_layout(self.n_estimate_ * (1.0 - share), eps_grids)
        eps_grid = eps_grids / len(self.groups_)
        G = U[~held]
        self.grids_ = []
        for g, bins in zip(self.groups_, self.grid_bins_):
            n_cells = bins ** len(g)
            false_cells = min(_FALSE_CELLS_MAX, max(_FALSE_CELLS_DENSE * n_cells, 0.5)) if n_cells > 1 else 0.5
            theta = cell_threshold(n_cells, eps_grid, false_cells)
            self.grids_.append(NoisyGrid.fit(G, g, bins, eps_grid, theta, noise))
        self.grid_epsilons_ = [eps_grid] * len(self.grids_)
        self.n_features_in_ = U.shape[1]
        self.calibration_ = self._calibrate(U[held], share, eps_grids, noise) if share > 0 else None
        self.epsilon_spent_ = float(self.epsilon)
        self.set_threshold(self.threshold, self.contamination)
        return self

    def _calibrate(self, H: np.ndarray, share: float, epsilon: float, noise) -> Calibration:
        """The held-apart rows' score histograms (see ``fit`` for the guarantee). The bins
        come from public things only: the score's range and a synthetic sample drawn from
        the released grids with the public seed (``calibration.public_edges``)."""
        scores = self._grid_scores_unit(H)
        synthetic = self._grid_scores_unit(self._synthetic(np.random.default_rng(_SYNTHETIC_SEED)))
        top = self._score_max()
        G = len(self.grids_)
        eps_score = epsilon * (SCORE_HISTOGRAM_SHARE if G > 1 else 1.0)
        prior = PRIOR
        syn = self._combine(synthetic)
        main = ScoreHistogram.release(self._combine(scores), public_edges(top, syn), eps_score, noise,
                                      syn if prior else None)
        per_grid = [main] if G == 1 else [
            ScoreHistogram.release(scores[:, i], public_edges(top, synthetic[:, i]), (epsilon - eps_score) / G, noise,
                                   synthetic[:, i] if prior else None)
            for i in range(G)]
        return Calibration(share=share, seed=SPLIT_SEED, score=main, grids=per_grid)

    def _score_max(self) -> float:
        """Public top of the score bins, in cells: the search radius (depth + 1/2 + half the
        cell diagonal of the widest grid) plus one cell for missing mass is the largest score
        ``NoisyGrid.score`` can return; the last bin is open above it."""
        p = max(len(g) for g in self.groups_)
        return float(self.max_depth_ + 1.5 + 0.5 * math.sqrt(p))

    @property
    def grid_rows_estimate_(self) -> float | None:
        """The noisy number of records the grids were fitted on: the noisy size times the
        share not held apart (post-processing; None if the size is unknown)."""
        n = getattr(self, "n_estimate_", None)
        if n is None:
            return None
        return n * (1.0 - getattr(self, "calibration_share_", 0.0))

    @property
    def cell_signal_(self) -> float | None:
        """Records in a grid's average cell, in units of that grid's noise scale (lowest
        over the grids): grid_rows_estimate_ * epsilon_grid / cells (the rows not held apart). The default layout aims at 1;
        below 0.25 the noise dominates the counts and scores may be near chance (a small
        reference set for the epsilon; ``monitor fit`` warns). Post-processing of the
        noisy size; None if unknown.

        >>> import numpy as np
        >>> X = np.random.default_rng(0).random((60, 3))
        >>> m = GridKNN(epsilon=0.1, bounds=[(0, 1)] * 3, random_state=0).fit(X)
        >>> m.cell_signal_ < 0.25
        True
        """
        self._check_fitted()
        n = self.grid_rows_estimate_
        if n is None:
            return None
        return min(max(n, 0.0) * eps / g.n_cells for g, eps in zip(self.grids_, self.grid_epsilons_))

    def set_threshold(self, threshold: float | None = None, contamination: float | None = None) -> "GridKNN":
        """Set the flag threshold after fit: explicit, or from a contamination rate; returns self.

        Post-processing of the private model, free in privacy: no refit, no charge.
        The contamination threshold is deterministic for a given model (a fixed public
        seed draws the synthetic sample), so saving and loading reproduce it.
        """
        self._check_fitted()
        _check_postprocessing(contamination, threshold)
        self.threshold, self.contamination = threshold, contamination
        if threshold is not None:
            self.threshold_ = float(threshold)
        elif contamination is not None:
            self.threshold_ = self.threshold_for(contamination)
        else:
            self.threshold_ = None
        return self

    def threshold_for(self, contamination: float, rng: "int | np.random.Generator" = _SYNTHETIC_SEED) -> float:
        """Score threshold that flags a share ``contamination`` of the user's normal data.

        Calibrated (models fitted with ``calibration_share`` > 0): the (1 - contamination)
        quantile of the released score histogram of the held-apart reference rows,
        ``normal_share_above``'s inverse. Post-processing, free, microseconds: the alarm
        may ask for any rate. Uncalibrated (older model files): the quantile of points
        drawn from the model's own noisy mass, which is NOT the share of real normal data
        (docs/model.md); ``rng`` only drives that public sampling.

        >>> X = np.random.default_rng(0).normal(50, 15, size=(2000, 2))
        >>> m = GridKNN(epsilon=1.0, bounds=[(0, 100), (0, 100)], contamination=0.05, random_state=0).fit(X)
        >>> bool(m.threshold_for(0.01) > m.threshold_for(0.1))
        True
        """
        if not 0 < contamination < 1:
            raise ValueError(f"contamination must be in (0, 1), got {contamination!r}")
        self._check_fitted()
        if self.calibration_ is not None:
            return self.calibration_.score.threshold_for(contamination)
        return float(np.quantile(self._score_unit(self._synthetic(np.random.default_rng(rng))), 1.0 - contamination))

    def normal_share_above(self, t) -> "float | np.ndarray":
        """Calibrated share of normal data scoring above t (scalar or array): the released
        histogram of the held-apart rows' scores, interpolated. Post-processing, free.

        Raises ValueError for an uncalibrated model (fitted with calibration_share=0, or a
        model file older than version 4: refit it).
        """
        self._check_fitted()
        if self.calibration_ is None:
            raise ValueError("this model has no calibration (calibration_share=0 or a model file before version 4): "
                             "refit it with `monitor fit` to get calibrated rates")
        return self.calibration_.score.share_above(t)

    def rate_accuracy(self, contamination: float):
        """The calibrated threshold of a rate and its accuracy (``calibration.RateAccuracy``:
        held-apart rows, rank accuracy, whether the part is large enough); None when the
        model is uncalibrated. Post-processing, free."""
        self._check_fitted()
        return None if self.calibration_ is None else self.calibration_.accuracy(contamination)

    def grid_scores(self, Y) -> np.ndarray:
        """Each grid's own score of RAW events Y: shape (n, number of grids). Post-processing, free."""
        self._check_fitted()
        return self._grid_scores_unit(scale_to_unit(Y, self.bounds_))

    def grid_thresholds(self, contamination: float, rng: "int | np.random.Generator" = _SYNTHETIC_SEED) -> np.ndarray:
        """Per grid, the score threshold flagging ``contamination`` of normal data by that
        grid's own score (each grid scores only its features).

        Calibrated: from each grid's released histogram of the held-apart rows (a one-grid
        model uses the model's score histogram). Uncalibrated (older files): from points
        drawn from the grid's own noisy mass above its noise floor. Post-processing, free."""
        self._check_fitted()
        if not 0 < contamination < 1:
            raise ValueError(f"contamination must be in (0, 1), got {contamination!r}")
        cal = self.calibration_
        if cal is not None:
            hists = cal.grids or [cal.score]  # (a one-grid model's is the score's own)
            return np.array([h.threshold_for(contamination) for h in hists])
        gen = np.random.default_rng(rng)
        out = np.empty(len(self.grids_))
        for i, (grid, eps) in enumerate(zip(self.grids_, self.grid_epsilons_)):
            U = gen.random((_N_SYNTHETIC, self.n_features_in_))
            w = _above_noise_floor(grid, eps, self.grid_rows_estimate_)
            if w.sum() > 0:
                pick = gen.choice(w.size, size=_N_SYNTHETIC, p=w / w.sum())
                coords = (grid.keys[pick, None] // grid._strides[None, :]) % grid.bins
                U[:, list(grid.features)] = (coords + gen.random(coords.shape)) / grid.bins
            out[i] = np.quantile(grid.score_fast(U, self.k_, self.max_depth_, self.weighted) * grid.bins, 1.0 - contamination)
        return out

    def report_parts(self) -> list[tuple[int, ...]]:
        """The features each part of a report's "where" names (public: the layout): each grid's
        where the layout has at least two one-feature grids (the report counts by those), else
        each feature of its joint grids alone: a joint grid cannot say by itself which of its
        features makes an event unusual (``part_scores`` then tells)."""
        self._check_fitted()
        if self.parts_are_grids():
            return [tuple(int(f) for f in g.features) for g in self.grids_]
        return [(f,) for f in sorted({int(f) for g in self.grids_ for f in g.features})]

    def parts_are_grids(self) -> bool:
        """Whether the report's parts are the grids (at least two one-feature grids, or only
        those) rather than the features (``report_parts``). Public: the layout."""
        return sum(len(g.features) == 1 for g in self.grids_) >= 2 or all(len(g.features) == 1 for g in self.grids_)

    def part_scores(self, Y) -> np.ndarray:
        """How unusual each RAW event is by each report part (``report_parts``), shape (n, parts):
        each grid's own score where the parts are grids; by feature, how far the model's score
        falls when that feature alone takes the value most usual beside the others (the lowest
        score over its grids' bin centres on its axis). Post-processing of the model, free;
        computed inside the trust boundary like the flags.

        >>> X = np.random.default_rng(0).normal(50, 5, size=(3000, 2))
        >>> m = GridKNN(epsilon=1.0, bounds=[(0, 100), (0, 100)], random_state=0).fit(X)
        >>> m.report_parts()
        [(0,), (1,)]
        >>> m.part_scores(np.array([[95.0, 50.0], [50.0, 95.0]])).argmax(axis=1).tolist()  # which feature is off
        [0, 1]
        """
        self._check_fitted()
        if self.parts_are_grids():
            return self.grid_scores(Y)
        U = scale_to_unit(Y, self.bounds_)  # a new array: moved in place below, one feature at a time
        score = self._grid_scores_unit(U)
        base = self._combine(score)
        moved = score.copy()  # the grids' scores with one feature moved; restored after each feature
        parts = self.report_parts()
        out = np.zeros((len(U), len(parts)))
        for j, (f,) in enumerate(parts):
            grids = [(i, g) for i, g in enumerate(self.grids_) if f in g.features]
            bins = max(g.bins for _, g in grids)
            kept = U[:, f].copy()
            for c in (np.arange(bins) + 0.5) / bins:
                U[:, f] = c
                for i, g in grids:
                    moved[:, i] = g.score_fast(U, self.k_, self.max_depth_, self.weighted) * g.bins
                np.maximum(out[:, j], base - self._combine(moved), out=out[:, j])
            U[:, f] = kept
            idx = [i for i, _ in grids]
            moved[:, idx] = score[:, idx]
        return out  # drops of the model's own score: one scale for every feature

    def part_thresholds(self, contamination: float) -> np.ndarray:
        """Per report part, the level its score is read against (``grid_unusual``): each grid's
        threshold at ``contamination``; for features, 1 (their scores are drops of one score, on
        one scale already). Post-processing, free."""
        if self.parts_are_grids():
            return self.grid_thresholds(contamination)
        return np.ones(len(self.report_parts()))

    def part_names(self, feature_names: Sequence[str]) -> list[str]:
        """One name per report part (``report_parts``): its features joined by '+'."""
        return ["+".join(feature_names[i] for i in part) for part in self.report_parts()]

    def grid_names(self, feature_names: Sequence[str]) -> list[str]:
        """One name per grid: its features joined by '+'."""
        return ["+".join(feature_names[i] for i in g.features) for g in self.grids_]

    def _grid_scores_unit(self, U: np.ndarray) -> np.ndarray:
        if not len(U):
            return np.zeros((0, len(self.grids_)))
        return np.column_stack([g.score_fast(U, self.k_, self.max_depth_, self.weighted) * g.bins for g in self.grids_])

    def _synthetic(self, gen: np.random.Generator) -> np.ndarray:
        """Points drawn from the noisy mass, in the unit cube.

        Grids are visited in order; each draws a cell for the features no earlier grid
        has set, in proportion to its noisy value above the grid's noise floor among the
        cells that agree with the features already set (its marginal when none agree), and
        a point uniform in that cell. Post-processing of the released cells: free.

        The noise floor (``_above_noise_floor``) is about half the largest noise an empty
        cell of the grid gets: without it the many empty cells' positive noise draws a
        share of the sample into regions with no reference data, and a contamination
        quantile lands far above the reference's own scores (measured on the bundled
        vitals: contamination 0.05 flagged 0.05 % of normal events and 10 % of anomalies;
        with the floor about 2 % and 100 %). On small reference sets that floor also
        removed real cells (up to 35 % of normal events flagged at 0.05 with the current
        default layouts), so it is capped at half the average real cell.
        """
        U = np.full((_N_SYNTHETIC, self.n_features_in_), np.nan)
        res = np.zeros(self.n_features_in_, dtype=np.int64)  # bins of the grid that set each feature
        for grid, eps in self._synthesis_order():
            fs = list(grid.features)
            unset = np.isnan(U[:, fs]).all(axis=0)
            if len(fs) == 1 and not unset[0] and res[fs[0]] < grid.bins:
                # Unfloored weights: the coarse cell was already drawn above the noise floor,
                # and flooring again would thin the fine grid's tails inside it.
                self._refine(U, fs[0], int(res[fs[0]]), grid, np.clip(grid.values, 0.0, None), gen)
                res[fs[0]] = grid.bins
                continue
            if not unset.any():
                continue
            res[np.array(fs)[unset]] = grid.bins
            w = _above_noise_floor(grid, eps, self.grid_rows_estimate_)
            if w.sum() <= 0:
                w = np.clip(grid.values, 0.0, None)
            if w.sum() <= 0:
                U[:, np.array(fs)[unset]] = gen.random((_N_SYNTHETIC, int(unset.sum())))
                continue
            coords = (grid.keys[:, None] // grid._strides[None, :]) % grid.bins  # (K, p)
            set_axes = np.flatnonzero(~unset)
            pick = np.empty(_N_SYNTHETIC, dtype=np.int64)
            for lo in range(0, _N_SYNTHETIC, 2048):
                rows = slice(lo, lo + 2048)
                W = np.broadcast_to(w, (min(2048, _N_SYNTHETIC - lo), w.size)).copy()
                for a in set_axes:
                    cell = np.minimum((U[rows, fs[a]] * grid.bins).astype(np.int64), grid.bins - 1)
                    W *= coords[None, :, a] == cell[:, None]
                tot = W.sum(axis=1)
                W[tot <= 0] = w  # no agreeing mass: fall back to the grid's own distribution
                cdf = np.cumsum(W, axis=1)
                u = gen.random(cdf.shape[0]) * cdf[:, -1]
                pick[rows] = (cdf < u[:, None]).sum(axis=1)
            pick = np.minimum(pick, w.size - 1)
            for a in np.flatnonzero(unset):
                U[:, fs[a]] = (coords[pick, a] + gen.random(_N_SYNTHETIC)) / grid.bins
        U[np.isnan(U)] = gen.random(int(np.isnan(U).sum()))
        return U

    def _synthesis_order(self) -> list:
        """(grid, epsilon) in the order ``_synthetic`` draws them. With one-feature grids, the
        layout's order (they refine each feature inside its coarse cell). With joint grids only
        (from MANY_D features), each grid next that shares the most features with those already
        set and still sets one (the earliest on ties), so that it draws them given the others:
        in the layout's order the disjoint windows set every feature independently of the other
        windows, such points score far above real rows, and as the calibration's prior they put
        the thresholds above them (30_satellite, 36 features: 0.0 of normal rows flagged at 1 %;
        0.8 % in this order)."""
        pairs = list(zip(self.grids_, self.grid_epsilons_))
        if any(len(g.features) == 1 for g in self.grids_):
            return pairs
        order, done = [], set()
        while pairs:
            best = max(range(len(pairs)), key=lambda i: (bool(set(pairs[i][0].features) - done),
                                                          len(set(pairs[i][0].features) & done), -i))
            order.append(pairs.pop(best))
            done |= set(order[-1][0].features)
        return order

    @staticmethod
    def _refine(U: np.ndarray, f: int, coarse_bins: int, grid, w: np.ndarray, gen: np.random.Generator) -> None:
        """Redraw feature f, set by a coarse joint grid, inside its coarse cell from a finer
        one-feature grid's mass: a point uniform in a coarse cell (a third of the range)
        would land where the fine grid has no mass, score high there, and put the
        contamination quantile far above the reference's own scores (measured: 0.3 % flagged
        for a contamination of 5 %). Cells without fine mass keep the coarse draw."""
        if w.sum() <= 0:
            return
        fine = grid.keys  # 1-D grid: keys are the cell indices
        owner = np.minimum(((fine + 0.5) / grid.bins * coarse_bins).astype(np.int64), coarse_bins - 1)
        coarse = np.minimum((U[:, f] * coarse_bins).astype(np.int64), coarse_bins - 1)
        for c in np.unique(coarse):
            wc = np.where(owner == c, w, 0.0)
            if wc.sum() <= 0:
                continue
            rows = np.flatnonzero(coarse == c)
            pick = gen.choice(fine.size, size=rows.size, p=wc / wc.sum())
            U[rows, f] = (fine[pick] + gen.random(rows.size)) / grid.bins

    # -- scoring --------------------------------------------------------------------------
    def _check_fitted(self) -> None:
        if not hasattr(self, "grids_"):
            raise RuntimeError("this GridKNN is not fitted: call fit() or GridKNN.load()")

    def _score_unit(self, U: np.ndarray) -> np.ndarray:
        # Each grid scores in its own cells (not unit-cube distance): a fine 1-feature grid
        # and a coarse 3-feature grid then weigh alike, and the fine one's small distances
        # are not drowned by the coarse one's large cells.
        return self._combine(self._grid_scores_unit(U)) if len(U) else np.zeros(0)

    def _combine(self, S: np.ndarray) -> np.ndarray:
        """The model's score from the grids' scores S (n, grids): their power mean.

        A power mean of non-negative values lies between their mean and their largest,
        so it stays inside the score histograms' public range (``_score_max``)."""
        p = float(self.score_power)
        if p == 1.0:
            return S.mean(axis=1)
        return np.mean(np.maximum(S, 0.0) ** p, axis=1) ** (1.0 / p)

    def score_samples(self, Y) -> np.ndarray:
        """Outlier scores of RAW events Y (n, d): higher = more outlying.

        The power mean (``score_power``) over the grids of Algorithm 1's score, in cells of
        each grid. Post-processing of the private model: no privacy cost for the reference data.
        """
        self._check_fitted()
        return self._score_unit(scale_to_unit(Y, self.bounds_))

    def predict(self, Y) -> np.ndarray:
        """1 = outlier (score > threshold_), 0 = inlier, per event."""
        self._check_fitted()
        if self.threshold_ is None:
            raise ValueError("no threshold: set threshold or contamination (set_threshold needs no refit)")
        return (self.score_samples(Y) > self.threshold_).astype(np.int64)

    # -- persistence ----------------------------------------------------------------------
    def save(self, path) -> None:
        """Write the model file (versioned, checksummed JSON; no raw count)."""
        save_model(self, path)

    @classmethod
    def load(cls, path) -> "GridKNN":
        """Read a model file; raises ModelFileError if missing, corrupt or of another version."""
        return read_model(path, cls)

    def check_features(self, names: Sequence[str], bounds) -> None:
        """Raise ModelFileError unless names and bounds equal the model's."""
        check_features(self, names, bounds)


def _above_noise_floor(grid, epsilon: float, n_estimate: float | None = None) -> np.ndarray:
    """A grid's noisy values less a noise floor, at least 0: the weights the synthetic
    samples draw cells with (see ``GridKNN._synthetic``).

    The floor is half the largest noise an empty cell of the grid gets, ln(cells) /
    (2 epsilon), but never more than half the average real cell, n / (2 cells) (n: the
    model's noisy record count, when it has one): on small reference sets the full floor
    removed real cells too."""
    floor = 0.5 * np.log(max(grid.n_cells, 2)) / epsilon
    if n_estimate is not None:
        floor = min(floor, 0.5 * max(n_estimate, 0.0) / grid.n_cells)
    return np.clip(grid.values - floor, 0.0, None)


def _check_postprocessing(contamination, threshold) -> None:
    if contamination is not None and not 0 < contamination < 0.5:
        raise ValueError(f"contamination must be in (0, 0.5), got {contamination!r}")
    if threshold is not None and not math.isfinite(threshold):
        raise ValueError(f"threshold must be finite, got {threshold!r}")
