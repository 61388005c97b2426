"""Prefetched dropout draws: the same masks, gradients and generator states as ``F.dropout`` inline."""

from __future__ import annotations

import threading

import pytest
import torch
import torch.nn.functional as F

import nextloc.models.dropout as dropout_module
from nextloc.models.dropout import Dropout, UniformStream, dropout, prefetched_dropout

SHAPES = [(3, 5), (2, 4, 7, 7), (1,), (40, 33)]  # with chunk=97 most draws cross chunk boundaries
RATES = [0.1, 0.2, 0.15, 0.5]


@pytest.fixture
def small_chunks(monkeypatch):
    """Chunks of 97 doubles, 2 ahead: every path of the stream (within, across and spanning chunks)."""
    monkeypatch.setattr(dropout_module, "CHUNK", 97)
    monkeypatch.setattr(dropout_module, "DEPTH", 2)


def _inputs(seed: int = 0) -> list[torch.Tensor]:
    gen = torch.Generator().manual_seed(seed)
    return [torch.randn(shape, generator=gen, requires_grad=True) for shape in SHAPES]


def _run(prefetch: bool) -> tuple[list[torch.Tensor], list[torch.Tensor], torch.Tensor]:
    torch.manual_seed(7)
    xs = _inputs()
    with prefetched_dropout(prefetch):
        outs = [dropout(x, p, training=True) for x, p in zip(xs, RATES, strict=True)]
    sum((o * (i + 1)).sum() for i, o in enumerate(outs)).backward()
    return [o.detach() for o in outs], [x.grad for x in xs], torch.get_rng_state()


@pytest.mark.parametrize("chunked", [False, True])
def test_same_outputs_gradients_and_generator_state(chunked, request):
    if chunked:
        request.getfixturevalue("small_chunks")
    want_out, want_grad, want_state = _run(prefetch=False)
    got_out, got_grad, got_state = _run(prefetch=True)
    for got, want in zip(got_out + got_grad, want_out + want_grad, strict=True):
        assert torch.equal(got, want)
    assert torch.equal(got_state, want_state)


def test_negative_zeros_and_scale_match_bitwise():
    """The noise is F.dropout's (0 or 1/(1-p) in float32), so dropped negatives stay -0.0."""
    x = -torch.rand(10_000) - 0.5
    torch.manual_seed(1)
    want = F.dropout(x, 0.3, training=True)
    torch.manual_seed(1)
    with prefetched_dropout():
        got = dropout(x, 0.3, training=True)
    assert torch.equal(got.view(torch.int32), want.view(torch.int32))


def test_module_is_nn_dropout_with_the_same_repr():
    layer = Dropout(0.1)
    assert isinstance(layer, torch.nn.Dropout)
    assert repr(layer) == repr(torch.nn.Dropout(0.1))
    layer.eval()
    x = torch.randn(4, 4)
    with prefetched_dropout():
        assert layer(x) is x or torch.equal(layer(x), x)


def test_inline_outside_the_block_in_eval_and_at_the_edges():
    x = torch.randn(64)
    for p, training in [(0.1, True), (0.0, True), (1.0, True), (0.1, False)]:
        torch.manual_seed(2)
        want = F.dropout(x, p, training)
        torch.manual_seed(2)
        assert torch.equal(dropout(x, p, training), want)


def _draw_then(extra) -> None:
    with prefetched_dropout():
        dropout(torch.randn(8), 0.1, training=True)
        extra()


def test_another_draw_inside_the_block_raises():
    """Anything else drawing from the global generator would shift the masks: the block refuses."""
    with pytest.raises(RuntimeError, match="other than nextloc.models.dropout"):
        _draw_then(lambda: torch.rand(3))


def test_another_thread_draws_inline_and_is_caught():
    result = {}

    def in_thread() -> None:
        def other() -> None:
            result["out"] = dropout(torch.ones(16), 0.5, training=True)

        thread = threading.Thread(target=other)
        thread.start()
        thread.join()

    with pytest.raises(RuntimeError, match="other than"):
        _draw_then(in_thread)
    assert result["out"].shape == (16,)


def test_not_reentrant_and_an_error_in_the_block_stops_the_thread():
    before = {t.name for t in threading.enumerate()}

    def nested() -> None:
        with pytest.raises(RuntimeError, match="already active"), prefetched_dropout():
            pass
        raise ValueError("boom")

    with pytest.raises(ValueError, match="boom"):
        _draw_then(nested)
    assert dropout_module._active is None
    assert {t.name for t in threading.enumerate()} <= before


def test_stream_rejects_bad_sizes():
    with pytest.raises(ValueError, match="chunk"):
        UniformStream(chunk=0)
