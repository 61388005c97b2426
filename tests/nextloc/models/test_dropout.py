"""nextloc's dropout: ``F.dropout`` without a generator; with a :class:`PCG64Dropout`, the masks of its PCG64
stream (the rate, the scale, the seed, the state and the exact bits), without touching torch's generator."""

from __future__ import annotations

import hashlib

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from nextloc.models import build_model
from nextloc.models.dropout import Dropout, PCG64Dropout, drawing_from, dropout


def _pcg64(x: torch.Tensor, p: float, seed: int = 0) -> torch.Tensor:
    return dropout(x, p, training=True, generator=PCG64Dropout(seed))


def test_module_is_nn_dropout_with_the_same_repr_and_f_dropout_without_a_generator():
    layer = Dropout(0.1)
    assert isinstance(layer, torch.nn.Dropout)
    assert repr(layer) == repr(torch.nn.Dropout(0.1))
    x = torch.randn(64)
    torch.manual_seed(2)
    want = F.dropout(x, 0.1, True)
    torch.manual_seed(2)
    assert torch.equal(layer(x), want)
    layer.eval()
    assert torch.equal(layer(x), x)


def test_without_a_generator_it_is_f_dropout_in_eval_and_at_the_edges():
    x = torch.randn(64)
    for p, training in [(0.1, True), (0.0, True), (1.0, True), (0.1, False)]:
        torch.manual_seed(2)
        want = F.dropout(x, p, training)
        torch.manual_seed(2)
        assert torch.equal(dropout(x, p, training), want)


def test_pcg64_masks_are_the_recorded_stream():
    """The masks of seed 3 for a sequence of draws, recorded from the module-global stream this generator
    replaced: the same stream, threshold arithmetic and draw order (the pointer recipes' results hold)."""
    generator = PCG64Dropout(3)
    outs = [
        dropout(torch.ones(n), p, True, generator)
        for n, p in [(37, 0.1), (1000, 0.2), (5, 0.5), (4096, 0.15)]
    ]
    assert [hashlib.sha256(o.numpy().tobytes()).hexdigest() for o in outs] == [
        "8bea48543dc6120f1cb4ea82a278c057c181f1b86a22c56d2511e3385a87eb7b",
        "2e5b0edc453ec6115e010fbdb0c228b0faccc9d715f6f3af306d412aeb99e991",
        "8933997710564e2b1f01f9165e20c2e37bafa1782f8ea115757719a3bc77df93",
        "e14c47ff3f265930dae876eea9325c4c2cabd07a15d17705b45b77fa1f520a3b",
    ]
    assert outs[2].tolist() == [0.0, 0.0, 2.0, 2.0, 2.0]
    assert [i for i, v in enumerate(outs[0].tolist()) if v == 0] == [1, 8, 15, 21, 28]
    assert generator.state == (
        '{"bit_generator": "PCG64", "has_uint32": 0, "state": {"inc": 221852925215265661335133513963461865899, '
        '"state": 129963447937701296134093580321320636423}, "uinteger": 0}'
    )


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
    generator = PCG64Dropout(3)
    dropout(x, 0.1, True, generator)
    state = generator.state
    second = dropout(x, 0.1, True, generator)
    other = PCG64Dropout(0)
    other.set_state(state)
    assert torch.equal(dropout(x, 0.1, True, other), second)
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


def test_pcg64_only_applies_in_training_on_cpu_float32():
    """In eval, at p in {0, 1} and for float64: F.dropout, the generator untouched."""
    x = torch.randn(64)
    generator = PCG64Dropout(0)
    state = generator.state
    assert torch.equal(dropout(x, 0.1, False, generator), x)
    torch.manual_seed(2)
    want = F.dropout(x.double(), 0.1, True)
    torch.manual_seed(2)
    assert torch.equal(dropout(x.double(), 0.1, True, generator), want)
    for p in (0.0, 1.0):
        assert torch.equal(dropout(x, p, True, generator), F.dropout(x, p, True))
    assert generator.state == state


def test_drawing_from_attaches_one_generator_to_every_dropout_of_a_model_and_detaches_it():
    """Inside the block every Dropout module (the attention weights' included) draws from the generator, in
    forward order; after it, none holds a generator."""
    model = build_model("pointer", 12, 4, max_seq_len=16)
    modules = [m for m in model.modules() if isinstance(m, Dropout)]
    assert modules
    assert not [m for m in model.modules() if isinstance(m, nn.Dropout) and not isinstance(m, Dropout)]
    generator = PCG64Dropout(0)
    with drawing_from(model, generator):
        assert all(m.generator is generator for m in modules)
    assert all(m.generator is None for m in modules)
    with pytest.raises(ValueError, match="boom"), drawing_from(model, generator):
        raise ValueError("boom")
    assert all(m.generator is None for m in modules)
