"""MHSA: the causal Transformer baseline of Hong et al. (2023) (mie-lab/location-prediction ``TransEncoder``).

Embedding (location + hour/quarter/weekday + duration, ``x sqrt(d)``, sinusoidal PE, dropout) -> post-norm
GELU Transformer encoder with causal and key-padding masks -> final LayerNorm -> output at ``len - 1`` ->
residual FC head with the user embedding -> logits over every location id. The GeoLife reference
configuration has 112,547 trainable parameters (``total_loc_num=1187``, ``total_user_num=46``).
"""

from __future__ import annotations

import torch
from torch import nn

from nextloc.models.batch import Batch
from nextloc.models.configs import MHSAConfig
from nextloc.models.embedding import (
    ContextEmbedding,
    MaskedEncoderLayer,
    ResidualHead,
    last_valid,
    valid_mask,
    xavier_init,
)


class MHSA(nn.Module):
    """Causal multi-head self-attention next-location model.

    Args:
        config: the architecture.
    """

    def __init__(self, config: MHSAConfig) -> None:
        super().__init__()
        self.config = config
        d = config.d_model
        self.embedding = ContextEmbedding(config.total_loc_num, d, config.dropout, positional=True)
        self.layers = nn.ModuleList(
            MaskedEncoderLayer(d, config.nhead, config.dim_feedforward, config.dropout, norm_first=False)
            for _ in range(config.num_layers)
        )
        self.norm = nn.LayerNorm(d)
        self.head = ResidualHead(
            d, config.total_user_num, config.total_loc_num, config.fc_dropout, config.dropout
        )
        xavier_init(self)

    def attention_mask(self, lengths: torch.Tensor, width: int) -> torch.Tensor:
        """Which keys each query may see: causal, not padding, and (ablation) not itself.

        Args:
            lengths: ``(B,)`` history lengths.
            width: padded length ``T``.

        Returns:
            ``(B, 1, T, T)`` boolean mask, True where query ``i`` may attend to key ``j``.
        """
        keys = valid_mask(lengths, width)  # (B, T)
        causal = torch.ones(width, width, dtype=torch.bool, device=lengths.device).tril()  # (T, T)
        if self.config.diagonal_mask:
            causal = causal.tril(diagonal=-1)  # (T, T), strictly earlier keys only
        return causal.unsqueeze(0).unsqueeze(0) & keys.unsqueeze(1).unsqueeze(1)  # (B, 1, T, T)

    def encode(self, batch: Batch) -> torch.Tensor:
        """Encoder output at every position (after the final LayerNorm).

        Args:
            batch: right-padded batch ``(B, T)``.

        Returns:
            ``(B, T, d)``; position ``t`` depends only on visits ``<= t`` (``< t`` with ``diagonal_mask``
            in the attention) and never on padding.
        """
        x = self.embedding(batch)  # (B, T, d)
        allowed = self.attention_mask(batch.lengths, x.shape[1])  # (B, 1, T, T)
        for layer in self.layers:
            x = layer(x, allowed)  # (B, T, d)
        return self.norm(x)  # (B, T, d)

    def forward(self, batch: Batch) -> torch.Tensor:
        """Score every location for each sample.

        Args:
            batch: right-padded batch ``(B, T)``.

        Returns:
            ``(B, total_loc_num)`` logits (nothing masked).
        """
        h = last_valid(self.encode(batch), batch.lengths)  # (B, d)
        return self.head(h, batch.user)  # (B, V)
