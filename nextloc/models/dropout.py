"""Dropout with an optional PCG64 source of masks: ``F.dropout`` unless a :class:`PCG64Dropout` is attached.

Every dropout of the models is a :class:`Dropout` module. With no generator attached it is
``F.dropout`` (the reference's masks, drawn from torch's global generator: mhsa's recipe, and every model
on CUDA or in evaluation). The trainer attaches a :class:`PCG64Dropout` for training where
``TrainConfig.dropout_rng == "pcg64"`` on a CPU (the pointer recipes and the LSTM), with
:func:`drawing_from`; all the model's :class:`Dropout` modules then draw from that one generator, in the
order the forward pass calls them.

Why PCG64: on a CPU, ``F.dropout``'s ``bernoulli_`` is a serial Mersenne-Twister loop, a large share of a
pointer training step; a NumPy PCG64 stream gives four 16-bit draws per 64-bit output at a fraction of that
cost (BENCHMARKS.md). An element is kept when its draw is below ``t = round((1 - p) * 65536)`` and kept
elements are scaled by ``65536 / t``: the drop rate is ``p`` to within ``2**-17`` (0.1 -> 0.1000061) and the
expected output is exactly the input. These are not ``F.dropout``'s masks, so it is a changed recipe, used
only where the 5-seed validation means stay within 0.3 points of the reference's
(:mod:`nextloc.training.train`). The draws never touch torch's generators, so they mix with a training
step's other random draws (the pointer's unknown-place augmentation). The output is ``x * noise``, a mul as
in ``F.dropout``, so the gradient is the noise.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from contextlib import contextmanager

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

PCG64_STREAM = 0x6E6C6470  # mixed into the seed: the dropout stream differs from any other PCG64(seed) stream


class PCG64Dropout:
    """A source of dropout noise: a NumPy PCG64 stream seeded with ``SeedSequence([seed, PCG64_STREAM])``.

    Args:
        seed: the run's seed.
    """

    def __init__(self, seed: int) -> None:
        self._bits = np.random.PCG64(np.random.SeedSequence([seed, PCG64_STREAM]))

    def noise(self, n: int, p: float) -> torch.Tensor:
        """``n`` float32 values: ``65536 / t`` where the next 16-bit draw is below ``t = round((1 - p) * 65536)``,
        else 0 (``0 < p < 1``; ``t`` is kept within 1..65535). Consumes ``ceil(n / 4)`` 64-bit outputs."""
        threshold = min(max(round((1 - p) * 65536), 1), 65535)
        draws = self._bits.random_raw(-(-n // 4)).view(np.uint16)[:n]
        noise = (draws < threshold).astype(np.float32)
        noise *= np.float32(65536 / threshold)
        return torch.from_numpy(noise)

    @property
    def state(self) -> str:
        """The stream's state as JSON text (it goes into resume files)."""
        return json.dumps(self._bits.state, sort_keys=True)

    def set_state(self, state: str) -> None:
        """Continue from a :attr:`state`."""
        self._bits.state = json.loads(state)


def dropout(x: torch.Tensor, p: float, training: bool, generator: PCG64Dropout | None = None) -> torch.Tensor:
    """``F.dropout(x, p, training)``, or with ``generator``'s masks for a CPU float32 ``x`` in training."""
    if (
        generator is None
        or not training
        or not 0.0 < p < 1.0
        or x.device.type != "cpu"
        or x.dtype != torch.float32
    ):
        return F.dropout(x, p, training)
    return x * generator.noise(x.numel(), p).view(x.shape)  # a mul, as F.dropout


class Dropout(nn.Dropout):
    """``nn.Dropout`` (not in-place) through :func:`dropout`, drawing from ``generator`` when one is set."""

    def __init__(self, p: float = 0.5) -> None:
        super().__init__(p)
        self.generator: PCG64Dropout | None = None

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return dropout(x, self.p, self.training, self.generator)


@contextmanager
def drawing_from(model: nn.Module, generator: PCG64Dropout | None) -> Iterator[None]:
    """Within the block, every :class:`Dropout` of ``model`` draws from ``generator`` (None: ``F.dropout``);
    on exit they are detached again."""
    modules = [m for m in model.modules() if isinstance(m, Dropout)]
    for module in modules:
        module.generator = generator
    try:
        yield
    finally:
        for module in modules:
            module.generator = None
