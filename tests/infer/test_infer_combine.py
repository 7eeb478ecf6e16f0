"""Combining member predictions: the pure maths, with expected values worked out by hand."""

from __future__ import annotations

import math

import pytest
import torch

from npudist.infer import contribution, finish


def test_mean_probs_of_two_members() -> None:
    # member A logits [0, 0] -> probs [0.5, 0.5]; member B logits [ln 3, 0] -> probs [0.75, 0.25].
    a = contribution(torch.tensor([[0.0, 0.0]]), "mean_probs")
    b = contribution(torch.tensor([[math.log(3.0), 0.0]]), "mean_probs")
    labels, scores = finish(a + b, 2, "mean_probs")
    assert scores.tolist()[0] == pytest.approx([0.625, 0.375])
    assert labels.tolist() == [0]


def test_mean_logits() -> None:
    s = contribution(torch.tensor([[1.0, 4.0]]), "mean_logits") + contribution(torch.tensor([[3.0, -2.0]]),
                                                                                "mean_logits")
    labels, scores = finish(s, 2, "mean_logits")
    assert scores.tolist() == [[2.0, 1.0]]
    assert labels.tolist() == [0]


def test_majority_vote_and_tie_goes_to_lowest_class() -> None:
    # Three members vote 2, 2, 0 on sample 0 and 1, 0, (1) on sample 1; four members tie 1-1 on sample 2.
    members = [torch.tensor([[0, 0, 9.0], [0, 9.0, 0]]), torch.tensor([[0, 0, 9.0], [9.0, 0, 0]]),
               torch.tensor([[9.0, 0, 0], [0, 9.0, 0]])]
    summed = sum(contribution(m, "vote") for m in members)
    labels, scores = finish(summed, 3, "vote")
    assert labels.tolist() == [2, 1]
    assert scores[0].tolist() == pytest.approx([1 / 3, 0, 2 / 3])
    tie = sum(contribution(torch.tensor(row), "vote") for row in ([[0, 5.0, 0]], [[5.0, 0, 0]]))
    assert finish(tie, 2, "vote")[0].tolist() == [0]


def test_bad_combine_and_shape_are_clear_errors() -> None:
    with pytest.raises(ValueError, match="combine 'median': choose one of mean_probs, mean_logits, vote"):
        finish(torch.zeros(1, 2), 1, "median")
    with pytest.raises(ValueError, match=r"\[batch, classes\] logits, got shape \(4,\)"):
        contribution(torch.zeros(4), "mean_probs")
