"""How member predictions become one answer: pure functions, so the maths is tested without ranks.

Each rank turns its logits into a contribution; the contributions are summed over ranks (one
all-reduce); ``finish`` turns the sum into labels and scores.
"""

from __future__ import annotations

import torch
from torch import Tensor

COMBINES = ("mean_probs", "mean_logits", "vote")
"""mean_probs: average softmax probabilities; mean_logits: average raw logits; vote: majority of labels."""


def check_combine(how: str) -> str:
    if how not in COMBINES:
        raise ValueError(f"combine {how!r}: choose one of {', '.join(COMBINES)}")
    return how


def contribution(logits: Tensor, how: str) -> Tensor:
    """This member's [batch, classes] float32 share of the sum: probabilities, logits or a one-hot vote."""
    if logits.dim() != 2:
        raise ValueError(f"a member must return [batch, classes] logits, got shape {tuple(logits.shape)}")
    logits = logits.detach().float()
    if how == "mean_probs":
        return torch.softmax(logits, dim=-1)
    if how == "mean_logits":
        return logits
    check_combine(how)
    return torch.nn.functional.one_hot(logits.argmax(dim=-1), logits.shape[-1]).float()


def finish(summed: Tensor, members: int, how: str) -> tuple[Tensor, Tensor]:
    """(labels, scores) from the summed contributions of ``members`` ranks.

    Scores are the mean probability / mean logit / share of votes. A tied vote goes to the lowest class
    index (torch.argmax returns the first maximum), the same on every rank.
    """
    check_combine(how)
    scores = summed / members
    return scores.argmax(dim=-1), scores
