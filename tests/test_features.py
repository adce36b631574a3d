import numpy as np
import pytest

from monitor.features import scale_to_unit


def test_scaling_uses_only_the_public_bounds_and_clips():
    X = np.array([[0.0, 50.0], [10.0, 150.0], [-5.0, 100.0]])
    out = scale_to_unit(X, [(0, 10), (50, 150)])
    assert out.tolist() == [[0.0, 0.0], [1.0, 1.0], [0.0, 0.5]]
    # The same row scales the same whatever else is in the batch: nothing data-dependent.
    assert scale_to_unit(X[:1], [(0, 10), (50, 150)]).tolist() == out[:1].tolist()


def test_bad_inputs_are_named():
    with pytest.raises(ValueError, match="shape"):
        scale_to_unit([[1.0]], [1, 2])
    with pytest.raises(ValueError, match="feature 1: max must be greater"):
        scale_to_unit([[1.0, 2.0]], [(0, 1), (3, 3)])
    with pytest.raises(ValueError, match="NaN"):
        scale_to_unit([[np.nan]], [(0, 1)])
    with pytest.raises(ValueError, match="3 features but bounds describe 2"):
        scale_to_unit(np.zeros((2, 3)), [(0, 1), (0, 1)])
