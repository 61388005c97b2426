"""Models: reference parameter counts, output contract, masking, padding invariance, AMP, a tiny overfit."""

from __future__ import annotations

import dataclasses
import functools
import subprocess
import sys

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from nextloc.models import build_model, count_parameters
from nextloc.models.batch import Batch
from nextloc.models.embedding import MaskedEncoderLayer, last_valid
from nextloc.models.ensemble import SeedEnsemble
from nextloc.models.registry import KINDS as KINDS_REGISTRY

KINDS = ["mhsa", "mhsa_diagonal", "pointer", "pointer_plus", "lstm"]
V, U = 40, 6  # small vocabularies for the behavioural tests


@pytest.fixture(autouse=True, scope="module")
def _one_thread():
    """Tiny models: intra-op threads only add overhead (and stall badly on a busy CI machine)."""
    previous = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(previous)


def make_batch(lengths: list[int], *, seed: int = 0) -> Batch:
    """A random right-padded batch (0 beyond each length), histories may contain the unseen id 1."""
    g = torch.Generator().manual_seed(seed)
    b, t = len(lengths), max(lengths)
    lens = torch.tensor(lengths)
    valid = torch.arange(t).unsqueeze(0) < lens.unsqueeze(1)

    def feature(low: int, high: int) -> torch.Tensor:
        return torch.randint(low, high, (b, t), generator=g) * valid  # (B, T)

    return Batch(
        loc=feature(1, V),
        time=feature(0, 96),
        weekday=feature(0, 7),
        duration=feature(0, 96),
        diff=feature(0, 8),
        user=torch.randint(1, U, (b,), generator=g),
        lengths=lens,
        target=torch.randint(1, V, (b,), generator=g),
        index=torch.arange(b),
    )


def select(batch: Batch, rows: list[int], width: int) -> Batch:
    """Rows of a batch, trimmed or zero-padded to ``width``."""

    def fit(x: torch.Tensor) -> torch.Tensor:
        x = x[rows]
        if x.dim() == 1:
            return x
        return F.pad(x, (0, max(0, width - x.shape[1])))[:, :width]

    return Batch(**{f.name: fit(getattr(batch, f.name)) for f in dataclasses.fields(batch)})


def small(kind: str, **overrides) -> nn.Module:
    torch.manual_seed(0)
    return build_model(kind, V, U, **overrides)


# --- reference parameter counts -------------------------------------------------------------------


@pytest.mark.parametrize(
    ("kind", "loc", "user", "overrides", "expected"),
    [
        ("mhsa", 1187, 46, {}, 112_547),  # GeoLife reference
        ("pointer", 1187, 46, {}, 251_476),
        ("lstm", 1187, 46, {}, 482_659),
        (
            "mhsa",
            7038,
            693,
            {"d_model": 96, "num_layers": 4, "dim_feedforward": 256, "fc_dropout": 0.1},
            1_823_518,
        ),
        ("lstm", 7038, 693, {"emb_size": 96, "hidden_size": 192}, 2_847_582),  # DIY reference
    ],
)
def test_reference_parameter_counts(kind, loc, user, overrides, expected):
    assert count_parameters(build_model(kind, loc, user, **overrides)) == expected


def test_frequency_bias_is_off_by_default_and_adds_one_parameter():
    assert not build_model("pointer", 1187, 46).config.use_frequency_bias
    assert count_parameters(build_model("pointer", 1187, 46, use_frequency_bias=True)) == 251_477


# --- contract ---------------------------------------------------------------------------------------


def test_registry_and_build_model_errors():
    networks = {k: KINDS_REGISTRY[k] for k in KINDS_REGISTRY if KINDS_REGISTRY[k].family == "neural"}
    ensembles = {k: e for k, e in KINDS_REGISTRY.items() if e.family == "ensemble"}
    assert set(networks) == set(KINDS)
    output_is_log_prob = {k: KINDS_REGISTRY[k].log_prob_output for k in [*networks, *ensembles]}
    assert output_is_log_prob == {
        "mhsa": False,
        "mhsa_diagonal": False,
        "pointer": True,
        "pointer_plus": True,
        "pointer_plus_ensemble": True,
        "lstm": False,
    }
    for entry in ensembles.values():
        assert entry.member in networks
        assert entry.size >= 2
    for entry in networks.values():
        config_cls = entry.config
        assert dataclasses.is_dataclass(config_cls)
        assert config_cls.__dataclass_params__.frozen
    with pytest.raises(ValueError, match="transformer"):
        build_model("transformer", V, U)
    # a removed kind is refused in one line that says why
    with pytest.raises(ValueError, match=r"^model kind 'pointer_plus_refit' was removed: .*new-place head"):
        build_model("pointer_plus_refit", V, U)
    with pytest.raises(ValueError, match="d_modle"):
        build_model("mhsa", V, U, d_modle=64)
    with pytest.raises(ValueError, match="diagonal_mask"):
        build_model("pointer", V, U, diagonal_mask=True)
    with pytest.raises(ValueError, match="divisible"):
        build_model("mhsa", V, U, d_model=30)


@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("train", [False, True])
def test_output_shape_and_finiteness(kind, train):
    model = small(kind).train(train)
    out = model(make_batch([5, 1, 3, 7]))
    assert out.shape == (4, V)
    assert out.dtype == torch.float32
    assert torch.isfinite(out).all()


@pytest.mark.parametrize("frequency_bias", [False, True])
def test_pointer_is_a_distribution(frequency_bias):
    model = small("pointer", use_frequency_bias=frequency_bias).eval()
    if frequency_bias:
        with torch.no_grad():
            model.freq_bias_scale.fill_(0.7)
    batch = make_batch([1, 4, 12, 1, 2])  # padding and length-1 histories
    for train in (False, True):
        log_p = model.train(train)(batch)
        assert torch.allclose(log_p.exp().sum(-1), torch.ones(5), atol=1e-6)
    # Without generator mass (gate -> 1) all probability sits on the history's locations.
    with torch.no_grad():
        model.ptr_gen_gate[2].bias.fill_(50.0)
    p = model.eval()(batch).exp()
    for row in range(5):
        seen = batch.loc[row, : batch.lengths[row]].unique()
        assert p[row, seen].sum().item() == pytest.approx(1.0, abs=1e-5)
    assert p[:, 0].max().item() < 1e-6  # padding id 0 is never copied


def test_pointer_frequency_bias_starts_as_reference():
    reference = small("pointer").eval()
    biased = build_model("pointer", V, U, use_frequency_bias=True).eval()
    missing = biased.load_state_dict(reference.state_dict(), strict=False).missing_keys
    assert missing == ["freq_bias_scale"]
    batch = make_batch([3, 9, 1])
    torch.testing.assert_close(biased(batch), reference(batch))


def test_pointer_new_options_are_off_by_default_and_add_no_parameter():
    config = build_model("pointer", 1187, 46).config
    assert not config.mask_unknown_copy
    assert config.unknown_dropout == 0.0
    assert not config.unknown_dropout_by_location
    for overrides in (
        {"mask_unknown_copy": True},
        {"unknown_dropout": 0.1, "unknown_dropout_by_location": True},
    ):
        assert count_parameters(build_model("pointer", 1187, 46, **overrides)) == 251_476
    with pytest.raises(ValueError, match="unknown_dropout"):
        build_model("pointer", V, U, unknown_dropout=1.0)


@pytest.mark.parametrize("kind", ["pointer", "pointer_plus"])
def test_pointer_mask_unknown_copy(kind):
    """No pointer mass on id 1; histories without 1 are unchanged; an all-1 history falls back to the generator."""
    reference = small(kind).eval()
    masked = small(kind, mask_unknown_copy=True).eval()
    masked.load_state_dict(reference.state_dict())
    batch = make_batch([6, 9, 4], seed=2)
    batch.loc[0, :3] = 1
    batch.loc[2, :4] = 1  # nothing copyable
    clean = dataclasses.replace(batch, loc=batch.loc.clone())
    clean.loc[1, : clean.lengths[1]] = torch.arange(2, 11)  # no 1 at all
    with torch.no_grad():
        masked.ptr_gen_gate[2].bias.fill_(50.0)  # gate -> 1: everything copyable comes from the pointer
        reference.ptr_gen_gate[2].bias.fill_(50.0)
        p = masked(batch).exp()
        assert torch.allclose(p.sum(-1), torch.ones(3), atol=1e-5)
        assert p[:2, 1].max().item() < 1e-6
        assert p[0, batch.loc[0, 3:6].unique()].sum().item() == pytest.approx(1.0, abs=1e-5)
        gen = torch.softmax(masked.gen_head(last_valid(masked._encode(batch)[0], batch.lengths)), -1)
        torch.testing.assert_close(p[2], gen[2], rtol=0, atol=1e-6)
        torch.testing.assert_close(masked(clean)[1], reference(clean)[1])


def test_pointer_unknown_dropout_position_mode():
    model = small("pointer", unknown_dropout=0.5).train()
    batch = make_batch([12, 7, 3, 12], seed=4)
    batch.loc[batch.loc == 1] = 2
    torch.manual_seed(0)
    augmented, labels = model._unknown_augment(batch)
    assert torch.equal(labels, batch.loc)
    assert torch.equal(augmented.target, batch.target)
    changed = augmented.loc != batch.loc
    assert changed.any()
    assert (augmented.loc[changed] == 1).all()
    assert (batch.loc[changed] >= 2).all()  # padding never touched
    torch.manual_seed(0)
    again, _ = model._unknown_augment(batch)
    assert torch.equal(again.loc, augmented.loc)  # seeded by the global RNG
    # eval / forward never augment; training_loss does (and draws from the global RNG)
    model.eval()
    torch.manual_seed(1)
    reference = model.training_loss(batch, 0.0)
    torch.testing.assert_close(reference, F.cross_entropy(model(batch), batch.target, ignore_index=0))
    model.train()
    torch.manual_seed(1)
    state = torch.get_rng_state()
    model.training_loss(batch, 0.0).backward()
    assert not torch.equal(state, torch.get_rng_state())


def test_pointer_unknown_dropout_by_location_replaces_whole_places_and_targets():
    model = small(
        "pointer_plus", unknown_dropout=0.5, unknown_dropout_by_location=True, dense_loss_weight=0.5
    )
    model.train()
    batch = make_batch([12, 12, 12, 12, 5, 5, 5, 5], seed=5)
    batch.loc[batch.loc == 1] = 2
    batch.target = batch.loc[:, 0].clone()  # the target occurs in the history
    torch.manual_seed(0)
    augmented, labels = model._unknown_augment(batch)
    assert torch.equal(labels, augmented.loc)
    for row in range(8):
        hist, new = batch.loc[row], augmented.loc[row]
        for place in hist[hist >= 2].unique():
            gone = new[hist == place]
            assert (gone == 1).all() or (gone == place).all()  # all occurrences or none
        assert augmented.target[row] == (1 if new[0] == 1 else batch.target[row])
    assert (augmented.target == 1).any()
    assert (augmented.target != 1).any()
    loss = model.training_loss(batch, 0.03)
    loss.backward()
    assert torch.isfinite(loss)


def test_pointer_rejects_histories_longer_than_max_seq_len():
    model = small("pointer", max_seq_len=8).eval()
    with pytest.raises(ValueError, match="max_seq_len"):
        model(make_batch([9, 2]))


# --- masking ----------------------------------------------------------------------------------------


def test_mhsa_is_causal():
    model = small("mhsa").eval()
    batch = make_batch([10, 10])
    base = model.encode(batch)
    j = 6
    changed = dataclasses.replace(batch, loc=batch.loc.clone(), duration=batch.duration.clone())
    changed.loc[:, j] = (changed.loc[:, j] % (V - 2)) + 2
    changed.duration[:, j] = (changed.duration[:, j] + 7) % 96
    out = model.encode(changed)
    torch.testing.assert_close(out[:, :j], base[:, :j], rtol=0, atol=1e-6)  # earlier positions untouched
    assert (out[:, j:] - base[:, j:]).abs().amax(dim=-1).min() > 1e-4  # later ones all see the change


@pytest.mark.parametrize("kind", KINDS)
def test_items_beyond_length_are_ignored(kind):
    """Only the first ``len`` visits count, whatever the tensor holds after them."""
    model = small(kind).eval()
    full = make_batch([9, 9, 9], seed=3)
    cut = dataclasses.replace(full, lengths=torch.tensor([4, 1, 9]))
    expected = torch.cat([model(select(cut, [i], int(n))) for i, n in enumerate(cut.lengths)])
    torch.testing.assert_close(model(cut), expected, rtol=0, atol=1e-5)


@pytest.mark.parametrize(
    ("kind", "overrides"),
    [
        ("mhsa", {}),
        ("mhsa", {"diagonal_mask": True}),
        ("pointer", {}),
        ("pointer", {"use_frequency_bias": True}),
        ("lstm", {}),
    ],
)
def test_padding_does_not_change_outputs(kind, overrides):
    model = small(kind, **overrides).eval()
    if overrides.get("use_frequency_bias"):
        with torch.no_grad():
            model.freq_bias_scale.fill_(0.5)
    batch = make_batch([3, 11, 1, 6], seed=1)
    together = model(batch)
    for row, n in enumerate(batch.lengths.tolist()):
        alone = model(select(batch, [row], n))
        torch.testing.assert_close(together[row : row + 1], alone, rtol=0, atol=1e-5)


def test_lstm_reads_the_state_the_reference_packed_lstm_ends_in():
    """The reference packs the batch and reads h_n; the unpacked run read at each last real step is the same
    state (up to float rounding), so the head sees what the reference's would."""
    from torch.nn.utils.rnn import pack_padded_sequence

    model = small("lstm").eval()
    batch = make_batch([3, 11, 1, 6, 11], seed=2)
    with torch.no_grad():
        emb = model.embedding(batch)
        packed = pack_padded_sequence(emb, batch.lengths, batch_first=True, enforce_sorted=False)
        _, (h_n, _) = model.lstm(packed)
        expected = model.head(model.layer_norm(h_n[-1]), batch.user)
        torch.testing.assert_close(model(batch), expected, rtol=0, atol=1e-5)


def test_diagonal_mask_variant():
    default = small("mhsa").eval()
    diagonal = build_model("mhsa", V, U, diagonal_mask=True).eval()
    diagonal.load_state_dict(default.state_dict())
    batch = make_batch([1, 1, 5, 8])  # length-1 rows: the only position attends to nothing
    out = diagonal(batch)
    assert torch.isfinite(out).all()
    assert (out - default(batch)).abs().amax() > 1e-3
    # Still causal: changing visit 4 leaves the encoding of positions 0..3 untouched.
    changed = dataclasses.replace(batch, loc=batch.loc.clone())
    changed.loc[:, 4] = (changed.loc[:, 4] % (V - 2)) + 2
    torch.testing.assert_close(
        diagonal.encode(changed)[:, :4], diagonal.encode(batch)[:, :4], rtol=0, atol=1e-6
    )
    # Gradients through the empty attention row (position 0) are finite.
    diagonal.train()
    loss = F.cross_entropy(diagonal(batch), batch.target)
    loss.backward()
    assert all(torch.isfinite(p.grad).all() for p in diagonal.parameters() if p.grad is not None)


@pytest.mark.parametrize("norm_first", [False, True])
def test_masked_layer_matches_torch_encoder_layer(norm_first):
    """Same parameters, same math as ``nn.TransformerEncoderLayer`` (causal+padding or padding only)."""
    torch.manual_seed(0)
    d, heads, ff = 16, 4, 32
    ours = MaskedEncoderLayer(d, heads, ff, dropout=0.1, norm_first=norm_first).eval()
    ref = nn.TransformerEncoderLayer(
        d, heads, ff, 0.1, activation="gelu", batch_first=True, norm_first=norm_first
    )
    ref.load_state_dict(ours.state_dict())
    ref.eval()
    lengths = torch.tensor([5, 2, 7])
    x = torch.randn(3, 7, d)
    padding = torch.arange(7).unsqueeze(0) >= lengths.unsqueeze(1)  # (B, T)
    causal = not norm_first
    allowed = (~padding).unsqueeze(1).unsqueeze(1)
    attn_mask = None
    if causal:
        allowed = allowed & torch.ones(7, 7, dtype=torch.bool).tril()
        attn_mask = ~torch.ones(7, 7, dtype=torch.bool).tril()  # True = masked (future)
    with torch.no_grad():
        expected = ref(x, src_mask=attn_mask, src_key_padding_mask=padding)
        got = ours(x, allowed)
    torch.testing.assert_close(got[~padding], expected[~padding], rtol=1e-5, atol=1e-5)


def test_mhsa_matches_reference_formulation():
    """Seq-first stock ``nn.TransformerEncoder`` with -inf causal mask, as in mie-lab ``TransEncoder``."""
    model = small("mhsa").eval()
    d = model.config.d_model
    encoder = nn.TransformerEncoder(
        nn.TransformerEncoderLayer(d, 8, 128, activation="gelu"),
        2,
        norm=nn.LayerNorm(d),
        enable_nested_tensor=False,
    ).eval()
    encoder.load_state_dict(
        {k: v for k, v in model.state_dict().items() if k.startswith(("layers.", "norm."))}
    )
    batch = make_batch([3, 11, 1, 6], seed=2)
    e, src = model.embedding, batch.loc.T  # (T, B)
    emb = e.emb_loc(src) + e.hour_embed(batch.time.T // 4) + e.minute_embed(batch.time.T % 4)
    emb = emb + e.weekday_embed(batch.weekday.T) + e.emb_duration(batch.duration.T)
    emb = emb * d**0.5 + e.pos_table[: src.shape[0]].unsqueeze(1)
    causal = torch.triu(torch.full((src.shape[0],) * 2, float("-inf")), diagonal=1)
    padding = torch.zeros(src.T.shape).masked_fill(src.T == 0, float("-inf"))  # (B, T), float like ``causal``
    with torch.no_grad():
        out = encoder(emb, mask=causal, src_key_padding_mask=padding)
        expected = model.head(out[batch.lengths - 1, torch.arange(4)], batch.user)
        torch.testing.assert_close(model(batch), expected, rtol=1e-5, atol=1e-5)


def test_pointer_matches_reference_formulation():
    """Stock pre-norm encoder and the V45 pointer/generator/gate arithmetic with -inf padding."""
    model = small("pointer").eval()
    with torch.no_grad():
        model.position_bias.normal_()
    encoder = nn.TransformerEncoder(
        nn.TransformerEncoderLayer(64, 4, 128, 0.15, activation="gelu", batch_first=True, norm_first=True),
        2,
        enable_nested_tensor=False,
    ).eval()
    encoder.load_state_dict({k: v for k, v in model.state_dict().items() if k.startswith("layers.")})
    batch = make_batch([3, 11, 1, 6], seed=2)
    m, (b, t), lengths, loc = model, batch.loc.shape, batch.lengths, batch.loc
    pos = torch.arange(t).unsqueeze(0).expand(b, -1)
    from_end = (lengths.unsqueeze(1) - pos).clamp(0, 63)
    features = [m.loc_emb(loc), m.user_emb(batch.user).unsqueeze(1).expand(-1, t, -1), m.time_emb(batch.time)]
    features += [m.weekday_emb(batch.weekday), m.recency_emb(batch.diff), m.duration_emb(batch.duration)]
    hidden = m.input_norm(m.input_proj(torch.cat([*features, m.pos_from_end_emb(from_end)], -1)))
    padding = pos >= lengths.unsqueeze(1)
    with torch.no_grad():
        enc = encoder(hidden + m.pos_encoding[:t], src_key_padding_mask=padding)
        ctx = enc[torch.arange(b), lengths - 1]
        scores = (
            torch.bmm(m.pointer_query(ctx).unsqueeze(1), m.pointer_key(enc).transpose(1, 2)).squeeze(1) / 8
        )
        scores = (scores + m.position_bias[from_end]).masked_fill(padding, float("-inf"))
        ptr = torch.zeros(b, V).scatter_add_(1, loc, torch.softmax(scores, -1))
        gate = torch.sigmoid(m.ptr_gen_gate(ctx))
        expected = torch.log(gate * ptr + (1 - gate) * torch.softmax(m.gen_head(ctx), -1) + 1e-10)
        torch.testing.assert_close(model(batch), expected, rtol=1e-5, atol=1e-5)


# --- precision / device ----------------------------------------------------------------------------


@functools.cache
def _cpu_bf16_lstm_error() -> str | None:
    """None if a bfloat16 LSTM forward runs on this CPU, else why not.

    oneDNN, which runs ``nn.LSTM`` on CPU, has a bf16 LSTM only with AVX-512 (bf16) or AMX; without them
    it fails with "could not create a primitive descriptor for the LSTM forward propagation primitive"
    (reproduced with ``ONEDNN_MAX_CPU_ISA=AVX2``). The product never autocasts on CPU (train.py and
    evaluate.py autocast on CUDA only), so only this test meets it.
    """
    lstm = nn.LSTM(4, 4, batch_first=True)
    try:
        with torch.no_grad(), torch.autocast(device_type="cpu", dtype=torch.bfloat16):
            lstm(torch.zeros(1, 2, 4))
    except RuntimeError as err:
        return f"no bfloat16 LSTM on this CPU (oneDNN needs AVX-512 or AMX for it): {err}"
    return None


def _devices_and_dtypes() -> list[tuple[str, torch.dtype]]:
    cases = [("cpu", torch.bfloat16)]
    if torch.cuda.is_available():
        cases += [("cuda", torch.float16), ("cuda", torch.bfloat16)]
    return cases


@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize(("device", "dtype"), _devices_and_dtypes())
def test_autocast(kind, device, dtype):
    model = small(kind, **({"diagonal_mask": True} if kind == "mhsa" else {})).to(device).train()
    has_lstm = any(isinstance(m, nn.LSTM) for m in model.modules())
    if device == "cpu" and dtype == torch.bfloat16 and has_lstm and _cpu_bf16_lstm_error():
        pytest.skip(_cpu_bf16_lstm_error())
    batch = make_batch([1, 6, 3, 12]).to(device)
    with torch.autocast(device_type=device, dtype=dtype):
        out = model(batch)
        loss = (F.nll_loss if KINDS_REGISTRY[kind].log_prob_output else F.cross_entropy)(
            out.float(), batch.target
        )
    loss.backward()
    assert out.device.type == device
    assert out.shape == (4, V)
    assert torch.isfinite(out).all()
    assert torch.isfinite(loss)
    if kind == "pointer":
        assert out.dtype == torch.float32
        assert torch.allclose(out.exp().sum(-1), torch.ones(4, device=device), atol=1e-5)


# --- learning ----------------------------------------------------------------------------------------


@pytest.mark.parametrize("kind", KINDS)
def test_tiny_overfit(kind):
    model = small(kind).train()
    batch = make_batch(list(range(1, 17)), seed=5)  # 16 samples, lengths 1..16
    loss_fn = F.nll_loss if KINDS_REGISTRY[kind].log_prob_output else F.cross_entropy
    optimiser = torch.optim.Adam(model.parameters(), lr=3e-3)
    losses = []
    for _ in range(30):
        optimiser.zero_grad()
        loss = loss_fn(model(batch), batch.target)
        loss.backward()
        optimiser.step()
        losses.append(loss.item())
    assert losses[-1] < 0.7 * losses[0], losses


def test_models_package_does_not_import_orchestration_or_tracking():
    code = "import sys, nextloc.models; bad = {'prefect', 'mlflow'} & set(sys.modules); assert not bad, bad"
    subprocess.run([sys.executable, "-c", code], check=True)


@pytest.mark.parametrize("kind", KINDS)
def test_build_model_returns_registered_classes(kind):
    entry = KINDS_REGISTRY[kind]
    model = build_model(kind, V, U, dropout=0.3)
    assert isinstance(model, entry.model_class)
    expected = {**entry.presets, "dropout": 0.3}
    assert model.config == entry.config(total_loc_num=V, total_user_num=U, **expected)


def test_pointer_plus_is_the_reference_network_with_causal_attention():
    """Same parameters as Pointer V45; its encoder state at position t ignores later history items. It never
    copies the unseen token and is trained with unknown-place augmentation (both parameter-free)."""
    ref = build_model("pointer", 1187, 46, max_seq_len=64)
    plus = build_model("pointer_plus", 1187, 46, max_seq_len=64)
    assert count_parameters(ref) == count_parameters(plus) == 251_476
    assert plus.config.causal
    assert plus.config.mask_unknown_copy
    assert plus.config.unknown_dropout == 0.1
    assert not ref.config.causal
    assert not ref.config.mask_unknown_copy
    assert ref.config.unknown_dropout == 0.0
    plus.eval()
    batch = make_batch([6, 6], seed=0)
    altered = dataclasses.replace(batch, loc=batch.loc.clone())
    altered.loc[:, 4:] = 3
    h1, _, _ = plus._encode(batch)
    h2, _, _ = plus._encode(altered)
    torch.testing.assert_close(h1[:, :4], h2[:, :4])


def test_pointer_dense_loss_requires_causal_and_trains():
    with pytest.raises(ValueError, match="causal"):
        build_model("pointer", V, U, max_seq_len=16, dense_loss_weight=0.5)
    model = build_model("pointer_plus", V, U, max_seq_len=16, dense_loss_weight=0.5)
    batch = make_batch([5, 3, 1], seed=1)
    loss = model.training_loss(batch, label_smoothing=0.03)
    loss.backward()
    assert torch.isfinite(loss)


def test_seed_ensemble_averages_probabilities():
    """Two pointers (log-probabilities) and two MHSAs (logits): the ensemble is log of the mean probability."""
    batch = make_batch([4, 2], seed=3)
    for kind in ("pointer", "mhsa"):
        members = []
        for seed in (0, 1):
            torch.manual_seed(seed)
            extra = {"max_seq_len": 16} if kind == "pointer" else {}
            members.append(build_model(kind, V, U, **extra).eval())
        log_prob = KINDS_REGISTRY[kind].log_prob_output
        ensemble = SeedEnsemble(members, log_prob_output=log_prob).eval()
        with torch.no_grad():
            probs = [m(batch).exp() if log_prob else m(batch).softmax(-1) for m in members]
            torch.testing.assert_close(ensemble(batch).exp(), (probs[0] + probs[1]) / 2)
    assert count_parameters(ensemble) == 2 * count_parameters(members[0])
    with pytest.raises(ValueError, match="at least one"):
        SeedEnsemble([], log_prob_output=True)


# --- the kind registry (nextloc.models.registry) ------------------------------------------------------


def test_the_registry_declares_every_kind_once_and_the_views_derive_from_it():
    from nextloc.models import registry
    from nextloc.models.registry import training_recipe
    from nextloc.training.train import TrainConfig

    assert registry.kinds("neural") == tuple(KINDS)
    assert registry.neural_kinds() == (*KINDS[:4], "pointer_plus_ensemble", "lstm")
    assert registry.kinds("baseline") == ("markov", "most_frequent", "last_location")
    assert registry.kinds("routine") == ("routine", "ranker", "ranker_refit")
    assert registry.kinds() == (*registry.neural_kinds(), *registry.kinds("baseline", "routine"))
    for name, entry in registry.KINDS.items():
        assert entry.name == name
        assert entry.description
        if entry.family == "neural":
            assert isinstance(entry.recipe, TrainConfig)
            assert training_recipe(name) == entry.recipe
            assert issubclass(entry.model_class, nn.Module)
    ensemble = registry.kind("pointer_plus_ensemble")
    assert (ensemble.trained.name, ensemble.size, ensemble.log_prob_output) == ("pointer_plus", 5, True)
    assert registry.kind("ranker").model_class.__name__ == "RoutineRanker"  # imported on first use
    with pytest.raises(ValueError, match=r"unknown model kind 'transformer'; expected one of \['mhsa'"):
        registry.kind("transformer")
    assert not set(registry.REMOVED_KINDS) & set(registry.KINDS)  # a removed kind is no kind
    assert set(registry.DEFAULT_KINDS) <= set(registry.KINDS)
    with pytest.raises(ValueError, match="not a network"):
        build_model("markov", V, U)
    with pytest.raises(TypeError):
        registry.kind("mhsa").presets["d_model"] = 1  # type: ignore[index]


def test_a_kind_entry_checks_what_its_family_needs():
    from nextloc.models.registry import Kind

    entry = {"name": "x", "description": "a kind", "log_prob_output": False}
    with pytest.raises(ValueError, match="needs a config and a recipe"):
        Kind(**entry, family="neural", model="torch.nn:Linear", config=dataclasses.make_dataclass("C", []))
    with pytest.raises(ValueError, match="needs a member kind and a size >= 2"):
        Kind(**entry, family="ensemble", model="nextloc.models.ensemble:SeedEnsemble", member="mhsa", size=1)
    with pytest.raises(ValueError, match="needs a model class as 'module:Class'"):
        Kind(**entry, family="baseline", model="MarkovBaseline")
    with pytest.raises(TypeError):  # the entries are written with keywords
        Kind("x", "baseline", "positional", False, "nextloc.models.baselines:MarkovBaseline")  # type: ignore[misc]


def test_importing_the_models_leaves_torch_pandas_and_lightgbm_out():
    """The registry and the configs are read by every flow (a cached run trains nothing): no torch."""
    code = (
        "import sys, nextloc.models, nextloc.models.registry, nextloc.training.overrides; "
        "bad = {'torch', 'pandas', 'lightgbm'} & set(sys.modules); assert not bad, bad"
    )
    subprocess.run([sys.executable, "-c", code], check=True)
