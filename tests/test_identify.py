"""The private answer: counts from the KD-tree, output frequencies, what is released."""

from __future__ import annotations

import math

import numpy as np
import pytest

from monitor.identify import AnomalyIdentifier, Neighbourhood, flip_distance, is_anomaly, probability_correct
from monitor.identify.mechanism import randomized_answer


def _brute_neighbourhood(X: np.ndarray, q: np.ndarray, r: float) -> Neighbourhood:
    d = np.sqrt(((X - q) ** 2).sum(axis=1))
    within, t = [], 1
    while not within or within[-1] < len(X):
        within.append(int(np.count_nonzero(d <= t * r)))
        t += 1
    return Neighbourhood(int(np.count_nonzero(d == 0)), tuple(within), len(X))


@pytest.mark.parametrize("include_record", [False, True])
def test_tree_counts_give_the_same_answers_and_distances_as_brute_force(include_record):
    rng = np.random.default_rng(5)
    X = np.vstack([rng.normal(0.3, 0.05, (150, 2)), rng.uniform(0, 1, (30, 2))]).clip(0, 1)
    X = np.vstack([X, X[:10]])  # duplicates: records present more than once
    Q = np.vstack([X[::7], rng.uniform(0, 1, (20, 2))])
    r, beta = 0.06, 6
    ident = AnomalyIdentifier(beta, r, include_record=include_record).fit(X)
    brute = [_brute_neighbourhood(X, q, r) for q in Q]
    assert ident.exact_answers(Q).tolist() == [is_anomaly(nb, beta, include_record) for nb in brute]
    for k in (None, 1, 3):
        got = [flip_distance(nb, beta, k, include_record).m for nb in ident.neighbourhoods(Q, k)]
        want = [flip_distance(nb, beta, k, include_record).m for nb in brute]
        assert got == want, k
    # The data holds both answers and chains of shells, so the comparison is not vacuous.
    assert 0 < ident.exact_answers(Q).sum() < len(Q)
    assert max(m for m in want if m < math.inf) > beta + 1


def _frequencies(ident: AnomalyIdentifier, record, epsilon, k, n, seed) -> float:
    answers = ident.answer_many(np.repeat([record], n, axis=0), epsilon, k, rng=seed)
    return float(np.mean([a.answer for a in answers]))


@pytest.mark.parametrize("k", [None, 1])
def test_neighbouring_databases_output_frequencies_respect_e_epsilon(k):
    # x: the record q has exactly beta records within r (itself included) -> anomaly;
    # y = x plus one record next to q -> normal. The pair is an edge of both graphs (the
    # added record has beta + 1 >= T + 1 records around it), and the answer flips, so
    # the optimal mechanism is randomized response there: the e^eps bound is tight.
    eps, beta, r, n = 1.0, 4, 0.05, 40_000
    q = np.array([0.5, 0.5])
    base = np.vstack([q, q + [0.01, 0], q + [0, 0.01], q - [0.01, 0], np.random.default_rng(0).uniform(0.8, 1, (50, 2))])
    x = AnomalyIdentifier(beta, r).fit(base)
    y = AnomalyIdentifier(beta, r).fit(np.vstack([base, q - [0, 0.01]]))
    assert x.exact_answers([q]).tolist() == [True] and y.exact_answers([q]).tolist() == [False]
    px, py = _frequencies(x, q, eps, k, n, 1), _frequencies(y, q, eps, k, n, 2)
    bound = math.exp(eps)
    for a, b in ((px, py), (1 - py, 1 - px)):  # P(yes) and P(no), both directions of the bound
        assert a / b <= bound * 1.08
        assert a / b >= bound / 1.08  # tight: a mechanism wasting accuracy would fail here
    assert px == pytest.approx(probability_correct(eps, 1), abs=0.01)


def test_frequencies_of_a_deep_anomaly_follow_the_formula():
    # An isolated record far from everything: on the 1-sensitive graph it takes a
    # chain of additions to flip, so its answer is almost always right.
    rng = np.random.default_rng(3)
    X = np.vstack([[0.95, 0.95], rng.normal(0.2, 0.03, (200, 2)).clip(0, 1)])
    ident = AnomalyIdentifier(beta=5, radius=0.05).fit(X)
    (nb,) = ident.neighbourhoods([X[0]], 1)
    m_dp, m_sp = flip_distance(nb, 5).m, flip_distance(nb, 5, 1).m
    assert m_dp == 1 and m_sp > 5
    for k, m in ((None, m_dp), (1, m_sp)):
        freq = _frequencies(ident, X[0], 0.5, k, 20_000, 4)
        assert freq == pytest.approx(probability_correct(0.5, m), abs=0.015)


def test_sampled_accuracy_matches_the_expected_accuracy():
    rng = np.random.default_rng(11)
    X = np.vstack([rng.normal(0.5, 0.1, (400, 3)), rng.uniform(0, 1, (20, 3))]).clip(0, 1)
    ident = AnomalyIdentifier(beta=4, radius=0.1).fit(X)
    truth = ident.exact_answers(X)
    for k in (None, 2):
        expected = ident.probabilities_correct(X, 1.0, k)
        got = [a.answer for a in ident.answer_many(X, 1.0, k, rng=7)]
        assert np.mean(np.array(got) == truth) == pytest.approx(expected.mean(), abs=0.04)
    # Sensitive privacy is never less accurate than DP: its graph has fewer edges.
    assert np.all(ident.probabilities_correct(X, 1.0, 2) >= ident.probabilities_correct(X, 1.0, None) - 1e-12)
    assert ident.probabilities_correct(X[truth], 1.0, 2).mean() > ident.probabilities_correct(X[truth], 1.0, None).mean() + 0.1


def test_the_answer_releases_nothing_data_dependent_but_the_bit():
    rng = np.random.default_rng(2)
    X = np.vstack([rng.normal(0.5, 0.05, (100, 2)), [[0.0, 1.0]]]).clip(0, 1)
    ident = AnomalyIdentifier(beta=3, radius=0.05).fit(X)
    answers = ident.answer_many(X[[0, -1]], epsilon=0.5, sensitive_k=1, rng=0)
    dicts = [a.as_dict() for a in answers]
    for d in dicts:
        d.pop("value")
    assert dicts[0] == dicts[1]  # inlier and isolated record: same public fields
    a = answers[0]
    assert a.probability_correct == pytest.approx(math.exp(0.5) / (1 + math.exp(0.5)))
    assert a.mechanism == "identify_sensitive" and a.sensitive_k == 1 and a.delta == 0.0
    assert a.probability_correct_if(3) > a.probability_correct
    assert isinstance(ident.answer(X[0], 1.0).answer, bool)  # production randomness path


def test_randomized_answer_is_reproducible_and_validates():
    assert [randomized_answer(True, 1, 1.0, rng=s) for s in range(20)] == [randomized_answer(True, 1, 1.0, rng=s) for s in range(20)]
    with pytest.raises(ValueError, match="epsilon"):
        randomized_answer(True, 1, 0.0)
    with pytest.raises(ValueError, match="m must be >= 1"):
        probability_correct(1.0, 0)
    with pytest.raises(ValueError, match="beta"):
        AnomalyIdentifier(0, 0.1)
    with pytest.raises(ValueError, match="radius"):
        AnomalyIdentifier(2, 0.0)
    ident = AnomalyIdentifier(2, 0.1).fit([[0.1, 0.2]])
    with pytest.raises(ValueError, match="2 scaled features"):
        ident.answer([0.1, 0.2, 0.3], 1.0)
    with pytest.raises(ValueError, match="sensitive k"):
        ident.answer([0.1, 0.2], 1.0, sensitive_k=0)


def test_tiny_database_is_isolated_on_the_sensitive_graph():
    # Fewer than T = beta - k records in all: nothing can be added or removed on the
    # sensitive graph, so the answer is exact; the ordinary graph still randomizes.
    ident = AnomalyIdentifier(beta=5, radius=0.1).fit([[0.1, 0.1], [0.9, 0.9]])
    (nb,) = ident.neighbourhoods([[0.1, 0.1]], 1)
    assert flip_distance(nb, 5, 1).m == math.inf and flip_distance(nb, 5).m == 1
    assert all(a.answer for a in ident.answer_many([[0.1, 0.1]] * 200, 0.1, 1, rng=0))
