"""LSTM baseline (aetandrianwr/next_loc_clean_v2 ``src/models/baseline/LSTM.py``).

The MHSA embedding without position encoding or ``sqrt(d)`` scaling (dropout 0.1) -> 2-layer LSTM -> hidden
state after the last real visit -> LayerNorm -> the MHSA residual FC head (at the hidden width) -> logits over
every location id. The GeoLife reference configuration (emb 32, hidden 128) has 482,659 trainable parameters
(``total_loc_num=1187``, ``total_user_num=46``).

The reference packs the padded batch (``pack_padded_sequence``) and reads ``h_n``. Here the top layer's output
is read at each sequence's last real step: padding only follows a sequence's real steps, so it never reaches
that output, and the two give the same states (up to float rounding; ``tests/nextloc/test_models.py``). On a
CPU the packed path is a per-step loop; oneDNN's fused LSTM runs a whole padded batch in about a third of
its time, but GeoLife's batches of 32 hold 2.4x as many steps as real ones (histories of 1-51 visits, median
16). So on a CPU (``length_chunks``, the default) the batch is sorted by length and run in a few time
chunks, each a fused call on the rows still going, from the states the previous chunk ended in
(:func:`chunk_ends` chooses the chunks): a packed run at a few lengths instead of every one. On GeoLife that
trains the recipe 1.2x faster on one thread than one padded call (about 2.3 chunks a batch). On CUDA the
whole padded batch is one cuDNN call. In training, the dropout between the layers draws for the steps each
call runs (padded ones included), so its masks differ from the packed run's, and from one padded call's.
"""

from __future__ import annotations

from bisect import bisect_left
from dataclasses import dataclass

import torch
from torch import nn

from nextloc.data import Batch
from nextloc.models.embedding import ContextEmbedding, ResidualHead, last_valid


@dataclass(frozen=True)
class LSTMConfig:
    """LSTM hyper-parameters; defaults are the GeoLife reference (``config_LSTM_geolife.yaml``).

    Attributes:
        total_loc_num: location vocabulary size, output width.
        total_user_num: user vocabulary size.
        emb_size: embedding width (LSTM input).
        hidden_size: LSTM hidden width (and head width).
        num_layers: LSTM layers.
        lstm_dropout: dropout between LSTM layers (ignored with one layer).
        dropout: dropout of the embedding and of the head input.
        fc_dropout: dropout inside the head's residual block.
        length_chunks: on a CPU, run the LSTM over the batch sorted by length in time chunks, each on the
            rows still running (:func:`chunk_ends`); False runs it once over the whole padded batch.
    """

    total_loc_num: int
    total_user_num: int
    emb_size: int = 32
    hidden_size: int = 128
    num_layers: int = 2
    lstm_dropout: float = 0.2
    dropout: float = 0.1
    fc_dropout: float = 0.2
    length_chunks: bool = True


class LSTMModel(nn.Module):
    """LSTM next-location model.

    Initialisation follows the reference exactly: xavier-uniform ``weight_ih``, orthogonal ``weight_hh``,
    xavier-uniform for every other parameter with more than one dimension (embeddings, linear weights),
    and for **every** parameter whose name contains ``bias`` (the reference's rule, which therefore also
    covers the LayerNorm, BatchNorm and linear biases, not only the LSTM's): zeros with the second quarter
    ``[n/4, n/2)`` set to 1 — for the LSTM biases that quarter is the forget gate.

    Args:
        config: the architecture.
    """

    def __init__(self, config: LSTMConfig) -> None:
        super().__init__()
        self.config = config
        self.embedding = ContextEmbedding(
            config.total_loc_num, config.emb_size, config.dropout, positional=False
        )
        self.lstm = nn.LSTM(
            input_size=config.emb_size,
            hidden_size=config.hidden_size,
            num_layers=config.num_layers,
            dropout=config.lstm_dropout if config.num_layers > 1 else 0.0,
            batch_first=True,
        )
        self.layer_norm = nn.LayerNorm(config.hidden_size)
        self.head = ResidualHead(
            config.hidden_size, config.total_user_num, config.total_loc_num, config.fc_dropout, config.dropout
        )
        self._init_weights()

    def _init_weights(self) -> None:
        for name, parameter in self.named_parameters():
            if "weight_ih" in name:
                nn.init.xavier_uniform_(parameter)
            elif "weight_hh" in name:
                nn.init.orthogonal_(parameter)
            elif "bias" in name:
                n = parameter.shape[0]
                with torch.no_grad():
                    parameter.zero_()
                    parameter[n // 4 : n // 2] = 1.0
            elif parameter.dim() > 1:
                nn.init.xavier_uniform_(parameter)

    def forward(self, batch: Batch) -> torch.Tensor:
        """Score every location for each sample.

        Args:
            batch: right-padded batch ``(B, T)``.

        Returns:
            ``(B, total_loc_num)`` logits (nothing masked).
        """
        emb = self.embedding(batch)  # (B, T, emb)
        if self.config.length_chunks and emb.device.type == "cpu":
            h = self._last_states_by_length(emb, batch.lengths)
        else:
            out, _ = self.lstm(emb)  # (B, T, H): the top layer's state after each step (see the module doc)
            h = last_valid(out, batch.lengths)  # (B, H), after the last real step
        return self.head(self.layer_norm(h), batch.user)  # (B, V)

    def _last_states_by_length(self, emb: torch.Tensor, lengths: torch.Tensor) -> torch.Tensor:
        """The top layer's state after each row's last real step, run as a packed LSTM would but in a few
        time chunks: the rows sorted by length, longest first; each chunk runs the fused LSTM on the rows
        still going, from the states the previous chunk ended in. ``(B, T, emb) -> (B, H)``."""
        lengths = lengths.clamp(min=1)  # as last_valid: an empty history reads step 0
        order = torch.argsort(lengths, descending=True, stable=True)
        ordered = lengths[order]
        descending = ordered.tolist()
        negated = [-n for n in descending]  # ascending: the rows longer than t are bisect_left(negated, -t)
        x = emb[order]
        pieces: list[torch.Tensor] = []  # per chunk, the rows that end in it: later chunks hold earlier rows
        state: tuple[torch.Tensor, torch.Tensor] | None = None
        start = 0
        for end in chunk_ends(descending):
            running = bisect_left(negated, -start)
            if state is not None:
                state = (state[0][:, :running], state[1][:, :running])
            out, state = self.lstm(x[:running, start:end], state)  # (running, end - start, H)
            done = bisect_left(negated, -end)  # rows [done, running) end in this chunk
            steps = ordered[done:running] - 1 - start
            pieces.append(out[done:running][torch.arange(running - done, device=out.device), steps])
            start = end
        last = torch.cat(pieces[::-1])  # (B, H) in length order
        return last[torch.argsort(order)]


CALL_COST = 128
"""What one more fused LSTM call costs, in row-steps (one row through one time step of every layer), for
:func:`chunk_ends`. Chosen on the recipe's training step (one CPU thread, GeoLife's batches of 32) among
16-256: 64-256 trained within noise of each other (1.15-1.25x one padded call), 16 and 32 slower."""


def chunk_ends(descending: list[int], call_cost: int = CALL_COST) -> list[int]:
    """Where the time chunks of :meth:`LSTMModel._last_states_by_length` end, for history lengths sorted
    longest first: the chunking with the least ``call_cost * chunks + sum(rows running * chunk steps)``
    (dynamic programming over the distinct lengths; the last end is the longest length).

    One chunk is the padded batch's cost; a chunk at every distinct length is the packed LSTM's row-steps,
    with a call per length.
    """
    ends = sorted(set(descending))
    points = [0, *ends]
    negated = [-n for n in descending]
    running = [bisect_left(negated, -t) for t in points]  # rows longer than each point
    best: list[float] = [0.0] + [float("inf")] * len(ends)
    previous = [0] * len(points)
    for j in range(1, len(points)):
        for i in range(j):
            cost = best[i] + call_cost + running[i] * (points[j] - points[i])
            if cost < best[j]:
                best[j], previous[j] = cost, i
    chosen = []
    j = len(points) - 1
    while j:
        chosen.append(points[j])
        j = previous[j]
    return chosen[::-1]
