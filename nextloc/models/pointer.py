"""Pointer V45: the pointer-generator Transformer of aetandrianwr/next_loc_clean_v2.

Inputs per visit: location and user embeddings (``d`` each) and five ``d/4`` embeddings (time slot,
weekday, recency = days before the target, duration bin, position counted from the end), concatenated,
projected to ``d``, LayerNorm, plus a sinusoidal table. A pre-norm GELU Transformer encoder (padding mask
only, no causal mask) encodes the history; the context is the output at ``len - 1``. Three heads:

* pointer: ``softmax_i((W_q ctx) . (W_k h_i) / sqrt(d) + position_bias[pos_from_end_i])`` over the history,
  scattered onto location ids (a location visited twice gets both weights; padding gets none);
* generator: ``softmax(Linear(d -> V)(ctx))`` over every location;
* gate: ``g = sigmoid(Lin(d/2 -> 1)(GELU(Lin(d -> d/2)(ctx))))``.

The output is ``log(g * ptr + (1 - g) * gen + 1e-10)``, a log-probability over all ``V`` ids. The GeoLife
reference configuration has 251,476 trainable parameters (``V=1187``, ``U=46``, ``max_seq_len=64``).

Optional improvement (off by default, so the reference is unchanged):

* ``use_frequency_bias``: a copy prior. Each history position's pointer score gets
  ``beta * log(1 + count)``, where ``count`` is how often that position's location occurs in the history and
  ``beta`` is a learned scalar initialised to 0 (the model starts as the reference). After the softmax and
  the scatter, a location's pointer mass is multiplied by ``(1 + count) ** beta`` (renormalised), so the
  model can learn to favour (``beta > 0``) or flatten (``beta < 0``) frequently visited places beyond the
  plain sum over repeated positions. One extra parameter.
* ``mask_unknown_copy``: history positions holding the id 1 ("location unseen in train") cannot be copied
  (their pointer score is masked like padding). Training histories hold no 1, so at inference the pointer
  would otherwise copy an id whose embedding was never trained and that no place metric credits. When a
  query has no copyable position at all, the gate is forced to 0 (the output is the generator's).
  No parameter.
* ``unknown_dropout``: "unknown-place" augmentation. In training mode only (``training_loss`` with
  ``self.training``), each valid history position holding a known place (id >= 2) is replaced by 1 with
  this probability, drawn from torch's global RNG (so runs stay reproducible and resumable); the model
  learns what a 1 in its input means (validation and test histories hold 1s, training histories none).
  The target is left unchanged. With ``unknown_dropout_by_location``, the draw is per (sample, location)
  instead: every occurrence of a drawn location in the history becomes 1, and so does the target (and the
  dense-loss next-location labels) when it is that location, which mimics places first visited after the
  training period. No parameter; inference is unchanged.
"""

from __future__ import annotations

import dataclasses
import math

import torch
import torch.nn.functional as F
from torch import nn

from nextloc.models.batch import Batch
from nextloc.models.configs import PointerConfig
from nextloc.models.embedding import MaskedEncoderLayer, last_valid, sinusoidal_table, valid_mask, xavier_init

# Reference embedding vocabularies (inputs are clamped into them).
TIME_VOCAB = 97  # start_min // 15 in 0..95, + 1 spare
WEEKDAY_VOCAB = 8  # 0..6, + 1 spare
RECENCY_VOCAB = 9  # diff in 0..7, + 1 spare
DURATION_VOCAB = 100  # duration // 30 in 0..95, + spares
LOG_EPS = 1e-10


class PointerGenerator(nn.Module):
    """Pointer-generator Transformer (Pointer V45).

    Args:
        config: the architecture.
    """

    def __init__(self, config: PointerConfig) -> None:
        super().__init__()
        self.config = config
        d = config.d_model
        quarter = d // 4
        self.loc_emb = nn.Embedding(config.total_loc_num, d, padding_idx=0)
        self.user_emb = nn.Embedding(config.total_user_num, d, padding_idx=0)
        self.time_emb = nn.Embedding(TIME_VOCAB, quarter)
        self.weekday_emb = nn.Embedding(WEEKDAY_VOCAB, quarter)
        self.recency_emb = nn.Embedding(RECENCY_VOCAB, quarter)
        self.duration_emb = nn.Embedding(DURATION_VOCAB, quarter)
        self.pos_from_end_emb = nn.Embedding(config.max_seq_len + 1, quarter)
        self.input_proj = nn.Linear(2 * d + 5 * quarter, d)
        self.input_norm = nn.LayerNorm(d)
        self.register_buffer("pos_encoding", sinusoidal_table(config.max_seq_len, d), persistent=False)
        self.layers = nn.ModuleList(
            MaskedEncoderLayer(d, config.nhead, config.dim_feedforward, config.dropout, norm_first=True)
            for _ in range(config.num_layers)
        )
        self.pointer_query = nn.Linear(d, d)
        self.pointer_key = nn.Linear(d, d)
        self.position_bias = nn.Parameter(torch.zeros(config.max_seq_len))
        self.gen_head = nn.Linear(d, config.total_loc_num)
        self.ptr_gen_gate = nn.Sequential(nn.Linear(d, d // 2), nn.GELU(), nn.Linear(d // 2, 1))
        self.freq_bias_scale: nn.Parameter | None = None
        if config.use_frequency_bias:
            self.freq_bias_scale = nn.Parameter(torch.zeros(()))
        xavier_init(self)

    def forward(self, batch: Batch) -> torch.Tensor:
        """Log-probabilities of the next location.

        Args:
            batch: right-padded batch ``(B, T)`` with ``T <= max_seq_len``.

        Returns:
            ``(B, total_loc_num)`` float32 log-probabilities (``exp`` sums to 1 up to ``V * 1e-10``).
        """
        hidden, valid, pos_from_end = self._encode(batch)
        context = last_valid(hidden, batch.lengths).unsqueeze(1)  # (B, 1, d)
        keys_allowed = valid.unsqueeze(1)  # (B, 1, T)
        return self._mix(context, hidden, keys_allowed, pos_from_end.unsqueeze(1), batch.loc).squeeze(1)

    def training_loss(self, batch: Batch, label_smoothing: float) -> torch.Tensor:
        """Cross-entropy on the target, plus (``dense_loss_weight``) next-location losses inside the history."""
        labels = batch.loc
        if self.training and self.config.unknown_dropout > 0:
            batch, labels = self._unknown_augment(batch)
        if not self.config.dense_loss_weight:
            return F.cross_entropy(self(batch), batch.target, ignore_index=0, label_smoothing=label_smoothing)
        hidden, valid, _ = self._encode(batch)
        bsz, width = batch.loc.shape
        positions = torch.arange(width, device=batch.loc.device)
        keys_allowed = (positions.unsqueeze(0) <= positions.unsqueeze(1)).unsqueeze(0) & valid.unsqueeze(
            1
        )  # (B, T, T)
        rel = (positions.unsqueeze(1) - positions.unsqueeze(0) + 1).clamp(
            0, self.config.max_seq_len - 1
        )  # (T, T)
        log_probs = self._mix(
            hidden, hidden, keys_allowed, rel.unsqueeze(0).expand(bsz, -1, -1), batch.loc
        )  # (B, T, V)
        rows = torch.arange(bsz, device=batch.loc.device)
        last = (batch.lengths - 1).clamp(min=0)
        main = F.cross_entropy(
            log_probs[rows, last], batch.target, ignore_index=0, label_smoothing=label_smoothing
        )
        next_loc = torch.zeros_like(batch.loc)
        next_loc[:, :-1] = labels[:, 1:] * valid[:, 1:]  # 0 (ignored) past the history
        aux = (
            F.cross_entropy(
                log_probs[:, :-1].reshape(-1, log_probs.shape[-1]),
                next_loc[:, :-1].reshape(-1),
                ignore_index=0,
                label_smoothing=label_smoothing,
            )
            if width > 1
            else main * 0
        )
        return main + self.config.dense_loss_weight * aux

    def _unknown_augment(self, batch: Batch) -> tuple[Batch, torch.Tensor]:
        """``unknown_dropout``: the batch with known history places replaced by 1, and the history labels
        of the dense loss (the original locations, or the augmented ones with ``unknown_dropout_by_location``).
        """
        loc, p = batch.loc, self.config.unknown_dropout
        known = loc >= 2  # (B, T); padding (0) and 1 are never touched
        if self.config.unknown_dropout_by_location:
            drawn = torch.rand(loc.shape[0], self.config.total_loc_num, device=loc.device) < p  # (B, V)
            drawn[:, :2] = False
            replace = drawn.gather(1, loc) & known  # (B, T)
            target = torch.where(drawn.gather(1, batch.target.unsqueeze(1)).squeeze(1), 1, batch.target)
            new_loc = loc.masked_fill(replace, 1)
            return dataclasses.replace(batch, loc=new_loc, target=target), new_loc
        replace = (torch.rand(loc.shape, device=loc.device) < p) & known  # (B, T)
        return dataclasses.replace(batch, loc=loc.masked_fill(replace, 1)), loc

    def _encode(self, batch: Batch) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """Encoder states ``(B, T, d)``, the validity mask ``(B, T)`` and positions from the end ``(B, T)``."""
        loc, lengths = batch.loc, batch.lengths
        width = loc.shape[1]
        m = self.config.max_seq_len
        if width > m:
            raise ValueError(f"history width {width} exceeds max_seq_len={m}")
        valid = valid_mask(lengths, width)  # (B, T)
        positions = torch.arange(width, device=loc.device)  # (T,)
        pos_from_end = (lengths.unsqueeze(1) - positions.unsqueeze(0)).clamp(0, m - 1)  # (B, T)

        features = torch.cat(
            [
                self.loc_emb(loc),  # (B, T, d)
                self.user_emb(batch.user).unsqueeze(1).expand(-1, width, -1),  # (B, T, d)
                self.time_emb(batch.time.clamp(0, TIME_VOCAB - 1)),  # (B, T, d/4)
                self.weekday_emb(batch.weekday.clamp(0, WEEKDAY_VOCAB - 1)),  # (B, T, d/4)
                self.recency_emb(batch.diff.clamp(0, RECENCY_VOCAB - 1)),  # (B, T, d/4)
                self.duration_emb(batch.duration.clamp(0, DURATION_VOCAB - 1)),  # (B, T, d/4)
                self.pos_from_end_emb(pos_from_end),  # (B, T, d/4)
            ],
            dim=-1,
        )  # (B, T, 2d + 5d/4)
        hidden = self.input_norm(self.input_proj(features))  # (B, T, d)
        hidden = hidden + self.pos_encoding[:width].unsqueeze(0)  # (B, T, d)

        if self.config.causal:
            causal = torch.ones(width, width, dtype=torch.bool, device=loc.device).tril()  # (T, T)
            allowed = causal.unsqueeze(0).unsqueeze(0) & valid.unsqueeze(1).unsqueeze(1)  # (B, 1, T, T)
        else:
            allowed = valid.unsqueeze(1).unsqueeze(1)  # (B, 1, 1, T): padding mask only
        for layer in self.layers:
            hidden = layer(hidden, allowed)  # (B, T, d)
        return hidden, valid, pos_from_end

    def _mix(
        self,
        context: torch.Tensor,
        hidden: torch.Tensor,
        keys_allowed: torch.Tensor,
        key_pos: torch.Tensor,
        loc: torch.Tensor,
    ) -> torch.Tensor:
        """Pointer + generator + gate for ``P`` query states ``context (B, P, d)`` -> ``(B, P, V)`` log-probs.

        ``keys_allowed (B, P, T)``: history positions each query may copy from; ``key_pos (B, P, T)``:
        position of each key counted back from the query (1 = the query's own position).
        """
        bsz, queries, _ = context.shape
        query = self.pointer_query(context) * (1.0 / math.sqrt(self.config.d_model))  # (B, P, d)
        keys = self.pointer_key(hidden)  # (B, T, d)
        scores = torch.bmm(query, keys.transpose(1, 2)).float()  # (B, P, T)
        scores = scores + self.position_bias.float()[key_pos]  # (B, P, T)
        if self.freq_bias_scale is not None:
            same = (loc.unsqueeze(2) == loc.unsqueeze(1)).unsqueeze(1) & keys_allowed.unsqueeze(
                2
            )  # (B, P, T, T)
            counts = same.sum(dim=-1).float()  # (B, P, T)
            scores = scores + self.freq_bias_scale.float() * torch.log1p(counts)  # (B, P, T)
        gate_mask = None
        if self.config.mask_unknown_copy:
            keys_allowed = keys_allowed & (loc != 1).unsqueeze(1)  # (B, P, T)
            gate_mask = keys_allowed.any(dim=-1, keepdim=True)  # (B, P, 1): something left to copy
        scores = scores.masked_fill(~keys_allowed, torch.finfo(torch.float32).min)
        ptr_probs = torch.softmax(scores, dim=-1) * keys_allowed  # (B, P, T); exactly 0 where not allowed
        index = loc.unsqueeze(1).expand(-1, queries, -1)  # (B, P, T)
        ptr_dist = torch.zeros(
            bsz, queries, self.config.total_loc_num, device=loc.device, dtype=torch.float32
        )
        ptr_dist = ptr_dist.scatter_add(2, index, ptr_probs)  # (B, P, V)

        gen_probs = torch.softmax(self.gen_head(context).float(), dim=-1)  # (B, P, V)
        gate = torch.sigmoid(self.ptr_gen_gate(context).float())  # (B, P, 1)
        if gate_mask is not None:
            gate = gate * gate_mask  # nothing copyable: the generator alone
        mixed = gate * ptr_dist + (1.0 - gate) * gen_probs  # (B, P, V)
        return torch.log(mixed + LOG_EPS)  # (B, P, V)
