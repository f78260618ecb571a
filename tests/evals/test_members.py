"""`python -m evals.members`: the statistics it reports, against values worked out by hand."""

from __future__ import annotations

import pytest

from evals.members import cosine, spearman


def test_spearman_is_the_rank_correlation_with_average_ranks_for_ties():
    assert spearman([1, 2, 3, 4], [10, 20, 30, 40]) == pytest.approx(1.0)
    assert spearman([1, 2, 3, 4], [4, 3, 2, 1]) == pytest.approx(-1.0)
    # ranks [1, 2.5, 2.5, 4] against [1, 2, 3, 4]: Pearson of those = 0.9486832980505138
    assert spearman([0.1, 0.2, 0.2, 0.3], [1, 2, 3, 4]) == pytest.approx(0.9486832980505138)
    assert spearman([0.5, 0.5, 0.5], [1, 2, 3]) is None  # members that all score the same carry no ranking


def test_cosine_of_update_directions():
    assert cosine([1.0, -1.0], [2.0, -2.0]) == pytest.approx(1.0)
    assert cosine([1.0, 0.0], [0.0, 1.0]) == pytest.approx(0.0)
    assert cosine([0.0, 0.0], [1.0, 1.0]) is None  # a zero step has no direction
