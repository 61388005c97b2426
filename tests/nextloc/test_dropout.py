"""Prefetched dropout draws: the same masks, gradients and generator states as ``F.dropout`` inline; PCG64
draws: the rate, the scale, the seed and the state, without touching torch's generator."""

from __future__ import annotations

import threading

import pytest
import torch
import torch.nn.functional as F

import nextloc.models.dropout as dropout_module
from nextloc.models.dropout import Dropout, UniformStream, dropout, pcg64_dropout, prefetched_dropout

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
        with pytest.raises(RuntimeError, match="already active"), pcg64_dropout():
            pass
        raise ValueError("boom")

    with pytest.raises(ValueError, match="boom"):
        _draw_then(nested)
    assert dropout_module._active is None
    assert {t.name for t in threading.enumerate()} <= before


def test_stream_rejects_bad_sizes():
    with pytest.raises(ValueError, match="chunk"):
        UniformStream(chunk=0)


# --- PCG64 draws -------------------------------------------------------------------------------------


def _pcg64(x: torch.Tensor, p: float, seed: int = 0) -> torch.Tensor:
    dropout_module.manual_seed(seed)
    with pcg64_dropout():
        return dropout(x, p, training=True)


@pytest.mark.parametrize("p", [0.1, 0.2, 0.5])
def test_pcg64_drops_at_the_rate_and_keeps_the_expected_value(p):
    """1M draws: the drop fraction is p within 5 standard errors; kept elements are scaled by 65536 / t,
    with t = round((1 - p) * 65536) the threshold, so the scale undoes exactly the keep probability t / 65536."""
    n = 1_000_000
    out = _pcg64(torch.ones(n), p)
    threshold = round((1 - p) * 65536)
    dropped = (out == 0).double().mean().item()
    assert abs(dropped - p) < 5 * (p * (1 - p) / n) ** 0.5
    assert abs(threshold / 65536 - (1 - p)) <= 2**-17
    assert set(out.unique().tolist()) == {0.0, torch.tensor(65536 / threshold, dtype=torch.float32).item()}


def test_pcg64_follows_its_seed_and_state_and_leaves_torch_alone():
    """The same seed gives the same masks, another seed others; a saved state replays the draws after it;
    torch's global generator is not drawn from."""
    x = torch.randn(4096)
    torch.manual_seed(5)
    before = torch.get_rng_state()
    first = _pcg64(x, 0.1, seed=3)
    assert torch.equal(torch.get_rng_state(), before)
    assert torch.equal(_pcg64(x, 0.1, seed=3), first)
    assert not torch.equal(_pcg64(x, 0.1, seed=4), first)
    dropout_module.manual_seed(3)
    with pcg64_dropout():
        dropout(x, 0.1, training=True)
        state = dropout_module.get_state()
        second = dropout(x, 0.1, training=True)
        dropout_module.set_state(state)
        assert torch.equal(dropout(x, 0.1, training=True), second)
    assert not torch.equal(second, first)


def test_pcg64_gradient_is_the_noise_and_negative_zeros_stay():
    """A mul, as F.dropout: the gradient is the noise; a dropped negative is -0.0."""
    x = (-torch.rand(3, 50, 7) - 0.5).requires_grad_()
    out = _pcg64(x, 0.3)
    out.sum().backward()
    scale = torch.tensor(65536 / round(0.7 * 65536), dtype=torch.float32)
    dropped = out.detach() == 0
    assert dropped.any()
    assert torch.equal(x.grad, torch.where(dropped, 0.0, scale))
    assert torch.equal(out.detach(), x.detach() * x.grad)
    assert torch.signbit(out.detach()[dropped]).all()


def test_pcg64_only_applies_in_training_on_cpu_float32_in_its_thread():
    """Outside the block, in eval, at p in {0, 1}, for float64 and from another thread: F.dropout."""
    x = torch.randn(64)
    with pcg64_dropout():
        assert torch.equal(dropout(x, 0.1, training=False), x)
        torch.manual_seed(2)
        want = F.dropout(x.double(), 0.1, True)
        torch.manual_seed(2)
        assert torch.equal(dropout(x.double(), 0.1, training=True), want)
        for p in (0.0, 1.0):
            assert torch.equal(dropout(x, p, training=True), F.dropout(x, p, True))
        result = {}

        def other() -> None:
            torch.manual_seed(9)
            result["out"] = dropout(x, 0.5, training=True)

        thread = threading.Thread(target=other)
        thread.start()
        thread.join()
        torch.manual_seed(9)
        assert torch.equal(result["out"], F.dropout(x, 0.5, True))
    assert dropout_module._active is None
