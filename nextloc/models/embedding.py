"""Pieces shared by the models: sinusoidal tables, the MHSA/LSTM input embedding, the residual FC head,
a masked Transformer encoder layer, and parameter initialisation.

Everything here works batch-first (``(B, T, ...)``) on :class:`nextloc.models.batch.Batch` tensors, creates its
masks on the input's device, and is safe under ``torch.autocast`` (fp16/bf16): masked attention scores
use a large finite negative and the softmax is taken in float32.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import nn

from nextloc.models.batch import Batch
from nextloc.models.dropout import Dropout

# Reference feature vocabularies (ML embed.py): time = start_min // 15 is split into hour and quarter.
QUARTERS_PER_HOUR = 4
HOURS_PER_DAY = 24
DAYS_PER_WEEK = 7
DURATION_BINS = 60 * 24 * 2 // 30  # 96: capped duration (< 2 days) in 30-minute bins


def sinusoidal_table(n_positions: int, d_model: int) -> torch.Tensor:
    """The Transformer sine/cosine position table (Vaswani et al.).

    Args:
        n_positions: number of rows (positions 0..n_positions-1).
        d_model: embedding width (even).

    Returns:
        ``(n_positions, d_model)`` float32 tensor with ``sin`` in even and ``cos`` in odd columns.
    """
    position = torch.arange(n_positions, dtype=torch.float32).unsqueeze(1)  # (P, 1)
    div = torch.exp(
        torch.arange(0, d_model, 2, dtype=torch.float32) * (-math.log(10000.0) / d_model)
    )  # (d/2,)
    table = torch.zeros(n_positions, d_model)
    table[:, 0::2] = torch.sin(position * div)
    table[:, 1::2] = torch.cos(position * div)
    return table


def valid_mask(lengths: torch.Tensor, width: int) -> torch.Tensor:
    """``(B, width)`` True at real (non-padded) positions ``t < lengths[b]``, on ``lengths``' device."""
    positions = torch.arange(width, device=lengths.device)  # (T,)
    return positions.unsqueeze(0) < lengths.unsqueeze(1)  # (B, T)


def last_valid(x: torch.Tensor, lengths: torch.Tensor) -> torch.Tensor:
    """The vector at position ``len - 1`` of every sequence: ``(B, T, d) -> (B, d)``."""
    batch_index = torch.arange(x.shape[0], device=x.device)  # (B,)
    return x[batch_index, (lengths - 1).clamp(min=0)]  # (B, d)


def xavier_init(module: nn.Module) -> None:
    """Reference initialisation: ``xavier_uniform_`` on every parameter with more than one dimension.

    Embedding tables are included (so padding rows are overwritten too, as in both references).
    """
    for parameter in module.parameters():
        if parameter.dim() > 1:
            nn.init.xavier_uniform_(parameter)


class ContextEmbedding(nn.Module):
    """The MHSA input embedding (ML ``AllEmbedding`` with time, duration, no POI), also used by the LSTM.

    ``loc + (hour(time // 4) + quarter(time % 4) + weekday) + duration``, all of width ``d_model``.
    With ``positional=True`` (MHSA) the sum is scaled by ``sqrt(d_model)`` and a sinusoidal table is
    added before the dropout; with ``positional=False`` (LSTM) only the dropout is applied.

    Args:
        total_loc_num: location vocabulary size (0 pad, 1 unseen, 2.. known).
        d_model: embedding width.
        dropout: dropout on the output.
        positional: add the scaled sinusoidal position encoding (max 5000 positions, as in the reference).
    """

    MAX_POSITIONS = 5000

    def __init__(self, total_loc_num: int, d_model: int, dropout: float, positional: bool) -> None:
        super().__init__()
        self.d_model = d_model
        self.positional = positional
        self.emb_loc = nn.Embedding(total_loc_num, d_model)
        self.minute_embed = nn.Embedding(QUARTERS_PER_HOUR, d_model)
        self.hour_embed = nn.Embedding(HOURS_PER_DAY, d_model)
        self.weekday_embed = nn.Embedding(DAYS_PER_WEEK, d_model)
        self.emb_duration = nn.Embedding(DURATION_BINS, d_model)
        self.dropout = Dropout(dropout)
        if positional:
            self.register_buffer("pos_table", sinusoidal_table(self.MAX_POSITIONS, d_model), persistent=False)

    def forward(self, batch: Batch) -> torch.Tensor:
        """Embed a batch.

        Args:
            batch: right-padded batch; uses ``loc``, ``time``, ``weekday``, ``duration``.

        Returns:
            ``(B, T, d_model)`` embeddings.
        """
        hour = torch.div(batch.time, QUARTERS_PER_HOUR, rounding_mode="floor")  # (B, T)
        quarter = batch.time % QUARTERS_PER_HOUR  # (B, T)
        emb = self.emb_loc(batch.loc)  # (B, T, d)
        emb = emb + (self.hour_embed(hour) + self.minute_embed(quarter) + self.weekday_embed(batch.weekday))
        emb = emb + self.emb_duration(batch.duration)  # (B, T, d)
        if self.positional:
            width = emb.shape[1]
            emb = emb * math.sqrt(self.d_model) + self.pos_table[:width].unsqueeze(0)  # (B, T, d)
        return self.dropout(emb)


class ResidualHead(nn.Module):
    """The reference output head (ML ``FullyConnected`` with the residual layer).

    ``h + user_emb(user)`` -> Dropout -> ``BatchNorm1d(h + Drop(Lin(2d->d)(Drop(ReLU(Lin(d->2d)(h))))))``
    -> ``Linear(d -> total_loc_num)``.

    Args:
        d_model: input width.
        total_user_num: user vocabulary size.
        total_loc_num: number of output classes (every location id, 0 and 1 included).
        fc_dropout: dropout inside the residual block.
        emb_dropout: dropout after adding the user embedding (0.1 in the reference).
    """

    def __init__(
        self, d_model: int, total_user_num: int, total_loc_num: int, fc_dropout: float, emb_dropout: float
    ) -> None:
        super().__init__()
        self.emb_user = nn.Embedding(total_user_num, d_model)
        self.emb_dropout = Dropout(emb_dropout)
        self.linear1 = nn.Linear(d_model, 2 * d_model)
        self.linear2 = nn.Linear(2 * d_model, d_model)
        self.norm1 = nn.BatchNorm1d(d_model)
        self.fc_dropout1 = Dropout(fc_dropout)
        self.fc_dropout2 = Dropout(fc_dropout)
        self.fc_loc = nn.Linear(d_model, total_loc_num)

    def forward(self, h: torch.Tensor, user: torch.Tensor) -> torch.Tensor:
        """Score every location.

        Args:
            h: ``(B, d)`` sequence summary.
            user: ``(B,)`` user ids.

        Returns:
            ``(B, total_loc_num)`` logits.
        """
        out = self.emb_dropout(h + self.emb_user(user))  # (B, d)
        residual = self.fc_dropout2(self.linear2(self.fc_dropout1(F.relu(self.linear1(out)))))  # (B, d)
        out = self.norm1(out + residual)  # (B, d)
        return self.fc_loc(out)  # (B, V)


class MaskedEncoderLayer(nn.TransformerEncoderLayer):
    """``nn.TransformerEncoderLayer`` (same parameters, same math) driven by an explicit boolean mask.

    The stock layer only accepts an additive/boolean mask whose fully-masked rows give NaN; here
    ``allowed[b, (h,) i, j]`` says whether query ``i`` may attend to key ``j``. Masked scores get the most
    negative finite float32 before a float32 softmax, and the weights are multiplied by ``allowed`` after
    it, so masked keys have exactly zero weight and a query with no allowed key attends to nothing (its
    attention output is the out-projection bias) instead of producing NaN. Dropout on the attention weights,
    residual dropouts, post-/pre-norm and the GELU feed-forward follow the stock layer.

    Constructed with ``batch_first=True``; inputs are ``(B, T, d)``.
    """

    def __init__(
        self, d_model: int, nhead: int, dim_feedforward: int, dropout: float, norm_first: bool
    ) -> None:
        super().__init__(
            d_model,
            nhead,
            dim_feedforward=dim_feedforward,
            dropout=dropout,
            activation="gelu",
            batch_first=True,
            norm_first=norm_first,
        )
        self.nhead = nhead
        # the stock layer's nn.Dropout modules, replaced by nextloc's (F.dropout unless a PCG64 source is
        # attached: nextloc.models.dropout), and the same for the attention weights
        self.dropout, self.dropout1, self.dropout2 = Dropout(dropout), Dropout(dropout), Dropout(dropout)
        self.attn_dropout = Dropout(dropout)

    def forward(self, src: torch.Tensor, allowed: torch.Tensor) -> torch.Tensor:  # type: ignore[override]
        """Apply the layer.

        Args:
            src: ``(B, T, d)`` input.
            allowed: boolean mask broadcastable to ``(B, nhead, T, T)``; True where query ``i`` may see key ``j``.

        Returns:
            ``(B, T, d)`` output.
        """
        x = src
        if self.norm_first:
            x = x + self.dropout1(self._masked_attention(self.norm1(x), allowed))
            x = x + self.dropout2(self._feed_forward(self.norm2(x)))
        else:
            x = self.norm1(x + self.dropout1(self._masked_attention(x, allowed)))
            x = self.norm2(x + self.dropout2(self._feed_forward(x)))
        return x

    def _feed_forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.linear2(self.dropout(F.gelu(self.linear1(x))))  # (B, T, d)

    def _masked_attention(self, x: torch.Tensor, allowed: torch.Tensor) -> torch.Tensor:
        batch, width, d_model = x.shape
        head_dim = d_model // self.nhead
        qkv = F.linear(x, self.self_attn.in_proj_weight, self.self_attn.in_proj_bias)  # (B, T, 3d)
        qkv = qkv.view(batch, width, 3, self.nhead, head_dim).permute(2, 0, 3, 1, 4)  # (3, B, h, T, dh)
        q, k, v = qkv[0], qkv[1], qkv[2]  # (B, h, T, dh)
        q = q * (1.0 / math.sqrt(head_dim))  # scale before the product, as torch does (no fp16 overflow)
        scores = torch.matmul(q, k.transpose(-2, -1)).float()  # (B, h, T, T)
        scores = scores.masked_fill(~allowed, torch.finfo(torch.float32).min)
        weights = torch.softmax(scores, dim=-1) * allowed  # (B, h, T, T); all-masked rows -> 0
        weights = self.attn_dropout(weights)
        out = torch.matmul(weights.to(v.dtype), v)  # (B, h, T, dh)
        out = out.transpose(1, 2).reshape(batch, width, d_model)  # (B, T, d)
        return self.self_attn.out_proj(out)  # (B, T, d)
