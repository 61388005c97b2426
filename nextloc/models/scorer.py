"""The bundle format's torch side: the scorer that wraps a network or a baseline (packed histories in,
probabilities out), and their weights in a bundle (:mod:`nextloc.bundle` imports this module only for those
kinds: a routine kind's answer imports no torch).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import safetensors.numpy
import safetensors.torch
import torch
from torch import nn

from nextloc.config import SampleConfig
from nextloc.models import model_config, model_from_config, registry
from nextloc.models.baselines import BaselineModule
from nextloc.models.packed import packed_batch
from nextloc.storage import write_with


class PackedScorer(nn.Module):
    """Wraps a model: ``(B, T, 6)`` int64 packed histories -> ``(B, V)`` probabilities.

    Args:
        model: a model (or :class:`~nextloc.models.baselines.BaselineModule`) taking a Batch.
        log_prob_output: whether the model returns log-probabilities (else logits/scores, softmaxed).
        duration_cap_min: the dataset's duration cap (``samples.duration_cap_min`` of its config).
    """

    def __init__(
        self, model: nn.Module, log_prob_output: bool, duration_cap_min: int = SampleConfig().duration_cap_min
    ) -> None:
        super().__init__()
        self.model = model
        self.log_prob_output = log_prob_output
        self.duration_cap_min = duration_cap_min

    def forward(self, packed: torch.Tensor) -> torch.Tensor:
        out = self.model(packed_batch(packed, self.duration_cap_min)).float()
        return out.exp() if self.log_prob_output else out.softmax(dim=-1)


def save_network(weights: Path, kind: str, model: nn.Module) -> dict[str, Any]:
    """Write a network's state dict, or a baseline's fitted arrays, to ``weights`` (atomically); returns the
    bundle's ``model`` field."""
    if isinstance(model, BaselineModule):
        params, arrays = model.baseline.state()
        write_with(lambda tmp: safetensors.numpy.save_file(arrays, str(tmp)), weights)
        return {"family": "baseline", "params": params, "log_prob_output": False}
    spec = {
        "family": "neural",
        "config": model_config(model),
        "log_prob_output": registry.kind(kind).log_prob_output,
    }
    model = model.cpu()
    write_with(lambda tmp: safetensors.torch.save_model(model, str(tmp)), weights)
    return spec


def load_network(
    weights: Path, kind: str, spec: dict[str, Any], duration_cap_min: int, spec_path: Path
) -> PackedScorer:
    """The scorer of a network or baseline bundle from its ``model`` field ``spec`` and ``weights``.

    Raises:
        ValueError: naming the file and field that is wrong (a kind of another family, weights that do not
            fit).
    """
    if spec["family"] == "baseline":
        baselines = registry.kinds("baseline")
        if kind not in baselines:
            raise ValueError(f"{spec_path}: field 'kind' {kind!r} is not a baseline ({sorted(baselines)})")
        arrays = safetensors.numpy.load_file(str(weights))
        baseline = registry.kind(kind).model_class.from_state(spec["params"], arrays)
        model: nn.Module = BaselineModule(baseline)
    else:
        model = model_from_config(kind, spec["config"])
        missing, unexpected = safetensors.torch.load_model(model, str(weights), strict=False)
        if missing or unexpected:
            raise ValueError(
                f"{weights}: weights do not fit a {kind!r} model (missing {missing}, unexpected {unexpected})"
            )
    model.eval()
    return PackedScorer(model, bool(spec["log_prob_output"]), duration_cap_min).eval()
