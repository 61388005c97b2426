"""LSTM baseline (aetandrianwr/next_loc_clean_v2 ``src/models/baseline/LSTM.py``).

The MHSA embedding without position encoding or ``sqrt(d)`` scaling (dropout 0.1) -> 2-layer LSTM -> hidden
state after the last real visit -> LayerNorm -> the MHSA residual FC head (at the hidden width) -> logits over
every location id. The GeoLife reference configuration (emb 32, hidden 128) has 482,659 trainable parameters
(``total_loc_num=1187``, ``total_user_num=46``).

The reference packs the padded batch (``pack_padded_sequence``) and reads ``h_n``. Here the LSTM runs once
over the whole padded batch (one fused oneDNN/cuDNN call) and the top layer's output is read at each
sequence's last real step: padding only follows a sequence's real steps, so it never reaches that output,
and the two give the same states up to float rounding (``tests/nextloc/models/test_models.py``). The packed
path is a per-step loop on a CPU, slower than the fused call (BENCHMARKS.md, Speed). In training, the
dropout between the layers (inside ``nn.LSTM``) draws for the padded steps too, so its masks differ from
the packed run's.
"""

from __future__ import annotations

import torch
from torch import nn

from nextloc.models.batch import Batch
from nextloc.models.configs import LSTMConfig
from nextloc.models.embedding import ContextEmbedding, ResidualHead, last_valid


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
        out, _ = self.lstm(emb)  # (B, T, H): the top layer's state after each step (see the module doc)
        h = last_valid(out, batch.lengths)  # (B, H), after the last real step
        return self.head(self.layer_norm(h), batch.user)  # (B, V)
