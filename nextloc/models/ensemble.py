"""A seed ensemble: the same model kind trained from several seeds, their probabilities averaged.

Members are trained independently (each fit on train, its epoch chosen on validation, like any single
model); the ensemble averages their next-place distributions, which removes much of the seed-to-seed
variance of these small models. Its output is a log-probability over the whole vocabulary, like the
pointer's.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import torch
from torch import nn

from nextloc.models.batch import Batch


class SeedEnsemble(nn.Module):
    """``log(mean_m p_m(next | history))`` over member models.

    Args:
        members: trained models of one kind.
        log_prob_output: whether the members return log-probabilities (pointer) or logits (MHSA, LSTM).
    """

    def __init__(self, members: Sequence[nn.Module], log_prob_output: bool) -> None:
        super().__init__()
        if not members:
            raise ValueError("an ensemble needs at least one member")
        self.members = nn.ModuleList(members)
        self.log_prob_output = log_prob_output

    def forward(self, batch: Batch) -> torch.Tensor:
        """``(B, V)`` float32 log-probabilities of the next location."""
        outs = [member(batch).float() for member in self.members]
        log_probs = torch.stack(
            outs if self.log_prob_output else [out.log_softmax(dim=-1) for out in outs]
        )  # (M, B, V)
        return torch.logsumexp(log_probs, dim=0) - math.log(len(self.members))
