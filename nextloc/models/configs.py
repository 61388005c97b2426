"""The networks' frozen config dataclasses, apart from the networks so that reading them needs no torch.

The kind registry (:mod:`nextloc.models.registry`) and the typed overrides (:mod:`nextloc.training.overrides`) read
these (their fields, presets and checks) in every flow; the networks themselves (:mod:`nextloc.models.mhsa`,
:mod:`nextloc.models.lstm`, :mod:`nextloc.models.pointer`) take one and import torch.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class MHSAConfig:
    """MHSA hyper-parameters; defaults are the GeoLife reference (``config/geolife/transformer.yml``).

    Attributes:
        total_loc_num: location vocabulary size, output width (0 pad, 1 unseen, 2.. known).
        total_user_num: user vocabulary size (users are 1..U-1).
        d_model: embedding and model width.
        nhead: attention heads.
        dim_feedforward: feed-forward width of each encoder layer.
        num_layers: encoder layers.
        dropout: dropout of the embedding, the encoder layers and the head input (0.1 everywhere in the reference).
        fc_dropout: dropout inside the head's residual block.
        diagonal_mask: ablation; no position may attend to itself (on top of the causal mask). The first
            position then attends to nothing and its attention output is the out-projection bias.
    """

    total_loc_num: int
    total_user_num: int
    d_model: int = 32
    nhead: int = 8
    dim_feedforward: int = 128
    num_layers: int = 2
    dropout: float = 0.1
    fc_dropout: float = 0.2
    diagonal_mask: bool = False

    def __post_init__(self) -> None:
        if self.d_model % self.nhead:
            raise ValueError(f"d_model={self.d_model} is not divisible by nhead={self.nhead}")


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
    """

    total_loc_num: int
    total_user_num: int
    emb_size: int = 32
    hidden_size: int = 128
    num_layers: int = 2
    lstm_dropout: float = 0.2
    dropout: float = 0.1
    fc_dropout: float = 0.2


@dataclass(frozen=True)
class PointerConfig:
    """Pointer V45 hyper-parameters; defaults are the GeoLife reference (``config_pointer_v45_geolife.yaml``).

    Attributes:
        total_loc_num: location vocabulary size ``V`` (0 pad, 1 unseen, 2.. known).
        total_user_num: user vocabulary size ``U``.
        d_model: model width ``d`` (divisible by 4 and by ``nhead``).
        nhead: attention heads.
        num_layers: encoder layers.
        dim_feedforward: feed-forward width.
        dropout: dropout of the encoder layers.
        max_seq_len: ``M``, the longest history the model accepts (reference: max history length + 10 = 64).
            Sizes the sinusoidal table, the position-from-end embedding (``M + 1`` rows, indices clamped to
            ``M - 1``) and the pointer position bias (``M``).
        use_frequency_bias: add the learned copy prior ``beta * log(1 + count)`` to the pointer scores.
        causal: causal self-attention (position ``t`` sees positions ``<= t``); the reference is bidirectional.
        dense_loss_weight: with ``causal``, also train every history position to predict the next history
            location (pointer over the positions up to it), weighted by this factor; the main loss on the
            real target is unchanged. This multiplies the training signal by the history length at no
            extra encoder cost.
        mask_unknown_copy: the pointer cannot copy history positions holding id 1 (see the module docstring).
        unknown_dropout: training-time probability of replacing a known history location by 1.
        unknown_dropout_by_location: draw ``unknown_dropout`` per distinct location of a sample (all its
            occurrences, and a target equal to it, become 1) instead of per history position.
    """

    total_loc_num: int
    total_user_num: int
    d_model: int = 64
    nhead: int = 4
    num_layers: int = 2
    dim_feedforward: int = 128
    dropout: float = 0.15
    max_seq_len: int = 64
    use_frequency_bias: bool = False
    causal: bool = False
    dense_loss_weight: float = 0.0
    mask_unknown_copy: bool = False
    unknown_dropout: float = 0.0
    unknown_dropout_by_location: bool = False

    def __post_init__(self) -> None:
        if self.d_model % 4:
            raise ValueError(f"d_model={self.d_model} must be divisible by 4")
        if self.d_model % self.nhead:
            raise ValueError(f"d_model={self.d_model} is not divisible by nhead={self.nhead}")
        if self.max_seq_len < 1:
            raise ValueError(f"max_seq_len={self.max_seq_len} must be >= 1")
        if self.dense_loss_weight and not self.causal:
            raise ValueError(
                "dense_loss_weight > 0 needs causal=True (earlier positions must not see later ones)"
            )
        if not 0.0 <= self.unknown_dropout < 1.0:
            raise ValueError(f"unknown_dropout={self.unknown_dropout} must be in [0, 1)")
