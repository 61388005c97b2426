"""Dropout whose random draws are prefetched on another core, bit-identical to ``torch.nn.functional.dropout``.

On a CPU, ``F.dropout(x, p)`` is ``x * (bernoulli_(1 - p) / (1 - p))``, and ``bernoulli_`` there is a serial
Mersenne-Twister loop: about a third of a reference MHSA training step. Its draws do not depend on the
data, only on the global generator's state and on how many elements were drawn before: element ``i`` of
``empty(n).bernoulli_(q)`` is ``u_i < q``, where ``u`` is the next ``n`` doubles that
``empty(n, dtype=float64).uniform_()`` would give (two 32-bit draws each, no per-call draw). So a
background thread can draw those doubles ahead of the training step from a copy of the generator, and the
step only compares, scales and multiplies: the same masks, the same noise values, the same ``mul`` for
autograd, hence bit-identical weights (``tests/nextloc/test_dropout.py`` checks masks, gradients, generator
states and a whole training).

The prefetching applies inside :func:`prefetched_dropout` (a training epoch in :func:`nextloc.train.fit`),
on CPU tensors only, and only for models whose every random draw in a training step is a :class:`Dropout`
or :func:`dropout` draw (:func:`streams_dropout`). On exit the global generator is set to exactly where
drawing inline would have left it; if anything else drew from it meanwhile, the exit raises instead of
letting the run silently differ from an inline one. Outside that block, and on CUDA, this is
``F.dropout``.

The thread pays off when a core is free (a single training, or the last one of ``nextloc run``); when the
cores are all busy it costs about what the inline draws cost.

**PCG64 draws** (:func:`pcg64_dropout`; on a CPU the trainer uses them where ``TrainConfig.dropout_rng`` is
``"pcg64"``: the pointer recipes and the LSTM). The
masks come from a stream of NumPy's PCG64 generator of its own (:func:`manual_seed`, :func:`get_state`,
:func:`set_state`; the trainer seeds it with the run's seed and keeps its state in resume files), four
16-bit draws per 64-bit output, so a mask costs about a tenth of ``bernoulli_``'s Mersenne-Twister loop and
needs no second core. An element is kept when its draw is below ``t = round((1 - p) * 65536)``, and kept
elements are scaled by ``65536 / t``: the drop rate is ``p`` to within ``2**-17`` (0.1 -> 0.1000061) and
the expected output is exactly the input. These masks are not ``F.dropout``'s (the stream and the rate's
last bits differ), so a recipe trained with them is a changed recipe (``nextloc.train``'s docstring has
its validation numbers); the draws do not touch torch's generators, so they mix with other random draws of
a training step (the pointer's unknown-place augmentation).
"""

from __future__ import annotations

import json
import queue
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import TypeVar

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

CHUNK = 1 << 20  # doubles per prefetched chunk (8 MiB; a reference MHSA step draws about 1.4M)
DEPTH = 3  # chunks kept ready ahead of the step

PCG64_STREAM = 0x6E6C6470  # mixed into the seed: the dropout stream differs from any other PCG64(seed) stream

_active: tuple[UniformStream | PCG64Draws, int] | None = None  # the running block's draws, the thread in it
_pcg64 = np.random.PCG64(np.random.SeedSequence([0, PCG64_STREAM]))


class UniformStream:
    """The global CPU generator's next uniform doubles, drawn ahead on a daemon thread from a copy of it.

    Args:
        chunk: doubles per chunk.
        depth: chunks drawn ahead.
    """

    def __init__(self, chunk: int = CHUNK, depth: int = DEPTH) -> None:
        if chunk < 1 or depth < 1:
            raise ValueError(f"chunk={chunk} and depth={depth} must be >= 1")
        self.start_state = torch.get_rng_state()
        self._chunk = chunk
        self._ready: queue.Queue[tuple[torch.Tensor, torch.Tensor] | BaseException] = queue.Queue(depth)
        self._stop = threading.Event()
        self._buffer = torch.empty(0, dtype=torch.float64)
        self._buffer_state = self.start_state  # the generator state before the buffer's first double
        self._used = 0  # doubles of the buffer already handed out
        self._thread = threading.Thread(target=self._produce, name="nextloc-dropout-draws", daemon=True)
        self._thread.start()

    def _produce(self) -> None:
        gen = torch.Generator()
        gen.set_state(self.start_state)
        try:
            while not self._stop.is_set():
                state = gen.get_state()
                values = torch.empty(self._chunk, dtype=torch.float64).uniform_(generator=gen)
                while not self._stop.is_set():
                    try:
                        self._ready.put((state, values), timeout=0.1)
                        break
                    except queue.Full:
                        continue
        except BaseException as exc:  # handed to the consumer, which raises it
            self._ready.put(exc)

    def _next_chunk(self) -> tuple[torch.Tensor, torch.Tensor]:
        item = self._ready.get()
        if isinstance(item, BaseException):
            raise RuntimeError("the dropout draw thread failed") from item
        return item

    def keep_mask(self, n: int, q: float) -> torch.Tensor:
        """``u < q`` for the next ``n`` doubles ``u``: ``empty(n).bernoulli_(q)`` as booleans."""
        if self._used + n <= len(self._buffer):
            out = torch.lt(self._buffer[self._used : self._used + n], q)
            self._used += n
            return out
        out = torch.empty(n, dtype=torch.bool)
        done = len(self._buffer) - self._used
        torch.lt(self._buffer[self._used :], q, out=out[:done])
        while done < n:
            state, values = self._next_chunk()
            take = min(n - done, len(values))
            torch.lt(values[:take], q, out=out[done : done + take])
            self._buffer, self._buffer_state, self._used = values, state, take
            done += take
        return out

    def noise(self, n: int, p: float) -> torch.Tensor:
        """``F.dropout``'s noise for ``n`` elements at rate ``p``: ``bernoulli_(1 - p) / (1 - p)`` in float32."""
        return self.keep_mask(n, 1 - p).to(torch.float32).div_(1 - p)

    def close(self) -> torch.Tensor:
        """Stop drawing; return the generator state after exactly the doubles handed out."""
        self._stop.set()
        self._thread.join()
        gen = torch.Generator()
        gen.set_state(self._buffer_state)
        if self._used:
            torch.empty(self._used, dtype=torch.float64).uniform_(generator=gen)
        return gen.get_state()


@contextmanager
def prefetched_dropout(enabled: bool = True) -> Iterator[None]:
    """Within the block, CPU :func:`dropout` draws come from a :class:`UniformStream` (see the module doc).

    Use it around a training loop's steps only (nothing else in the block may draw from torch's global
    generator); not re-entrant.

    Raises:
        RuntimeError: on exit, when something else drew from the global generator inside the block (the
            run would differ from an inline one), or when the block is entered while another is active.
    """
    if not enabled:
        yield
        return
    failed = False
    with _drawing_from(lambda: UniformStream(CHUNK, DEPTH)) as stream:
        try:
            yield
        except BaseException:
            failed = True
            raise
        finally:
            end_state = stream.close()
            if not failed:
                if not torch.equal(torch.get_rng_state(), stream.start_state):
                    raise RuntimeError(
                        "torch's global generator was used inside prefetched_dropout by something other than "
                        "nextloc.models.dropout; the draws would differ from an inline run (the model must "
                        "not be marked as streaming its dropout)"
                    )
                torch.set_rng_state(end_state)


class PCG64Draws:
    """Dropout noise from the module's PCG64 stream (see the module doc)."""

    def noise(self, n: int, p: float) -> torch.Tensor:
        """``n`` float32 values: ``65536 / t`` where the next 16-bit draw is below ``t = round((1 - p) * 65536)``,
        else 0 (``0 < p < 1``; ``t`` is kept within 1..65535)."""
        threshold = min(max(round((1 - p) * 65536), 1), 65535)
        draws = _pcg64.random_raw(-(-n // 4)).view(np.uint16)[:n]
        noise = (draws < threshold).astype(np.float32)
        noise *= np.float32(65536 / threshold)
        return torch.from_numpy(noise)


_Draws = TypeVar("_Draws", UniformStream, PCG64Draws)


def manual_seed(seed: int) -> None:
    """Seed the PCG64 dropout stream (``nextloc.train.seed_everything`` does, with the run's seed)."""
    global _pcg64
    _pcg64 = np.random.PCG64(np.random.SeedSequence([seed, PCG64_STREAM]))


def get_state() -> str:
    """The PCG64 dropout stream's state, as JSON text (it goes into resume files)."""
    return json.dumps(_pcg64.state, sort_keys=True)


def set_state(state: str) -> None:
    """Restore a state from :func:`get_state`."""
    _pcg64.state = json.loads(state)


@contextmanager
def pcg64_dropout(enabled: bool = True) -> Iterator[None]:
    """Within the block, CPU float32 :func:`dropout` draws of the thread that entered it come from the PCG64
    stream (see the module doc). Not re-entrant, and not inside :func:`prefetched_dropout`."""
    if not enabled:
        yield
        return
    with _drawing_from(PCG64Draws):
        yield


@contextmanager
def _drawing_from(make: Callable[[], _Draws]) -> Iterator[_Draws]:
    """Within the block, the calling thread's :func:`dropout` draws come from ``make()`` (made only when no
    other block is active: a dropout block is not re-entrant)."""
    global _active
    if _active is not None:
        raise RuntimeError("a dropout block is already active")
    draws = make()
    _active = (draws, threading.get_ident())
    try:
        yield draws
    finally:
        _active = None


def dropout(x: torch.Tensor, p: float, training: bool) -> torch.Tensor:
    """``F.dropout(x, p, training)``, with prefetched draws inside :func:`prefetched_dropout` and PCG64 draws
    inside :func:`pcg64_dropout` (CPU float32)."""
    active = _active
    if (
        active is None
        or active[1] != threading.get_ident()  # another thread: inline, as F.dropout
        or not training
        or not 0.0 < p < 1.0
        or x.device.type != "cpu"
        or x.dtype != torch.float32
    ):
        return F.dropout(x, p, training)
    return x * active[0].noise(x.numel(), p).view(x.shape)  # a mul, as F.dropout


class Dropout(nn.Dropout):
    """``nn.Dropout`` (not in-place) through :func:`dropout`."""

    def __init__(self, p: float = 0.5) -> None:
        super().__init__(p)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return dropout(x, self.p, self.training)


def streams_dropout(model: nn.Module) -> bool:
    """Whether every random draw of ``model``'s training step is a :func:`dropout` draw (so the draws may be
    prefetched): the model says so with a ``streams_dropout`` attribute (default False)."""
    return bool(getattr(model, "streams_dropout", False))
