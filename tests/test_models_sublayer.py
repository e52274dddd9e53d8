"""SubLayerModel structure and the package's own ViT."""

from __future__ import annotations

import itertools

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from torch import nn

from elastic_pipe.models import ModelError, SubLayerModel, ViTConfig, block_unit_ends, vit, vit_config
from elastic_pipe.types import ElasticPipeError


def _toy(n: int = 5, unit_ends: tuple[int, ...] = (2, 4)) -> SubLayerModel:
    return SubLayerModel([(f"l{i}", nn.Linear(3, 3)) for i in range(n)], unit_ends)


def test_block_unit_ends_exact() -> None:
    assert block_unit_ends(3) == (3, 5, 7)
    assert block_unit_ends(1, embed_layers=2, sublayers_per_block=1) == (3,)


def test_prefix_len_and_units_exact() -> None:
    model = _toy()
    assert model.num_units == 2
    assert model.num_sublayers == 5
    assert [model.prefix_len(k) for k in range(3)] == [0, 2, 4]
    assert [model.unit_of(i) for i in range(5)] == [0, 0, 1, 1, None]
    assert model.unit_bounds(1) == (2, 4)
    assert model.head_start() == 4
    assert model.unit_modules(0) == [model[0], model[1]]


@pytest.mark.parametrize(
    ("n", "ends"),
    [(5, ()), (5, (0, 2)), (5, (2, 5)), (5, (3, 3)), (5, (3, 2))],
)
def test_bad_unit_ends_rejected(n: int, ends: tuple[int, ...]) -> None:
    with pytest.raises(ModelError, match="unit_ends"):
        _toy(n, ends)


def test_duplicate_names_and_bad_indices_rejected() -> None:
    with pytest.raises(ModelError, match="unique"):
        SubLayerModel([("a", nn.Identity()), ("a", nn.Identity())], (1,))
    model = _toy()
    for bad in (model.prefix_len, model.unit_bounds):
        with pytest.raises(ModelError):
            bad(3)
    with pytest.raises(ModelError):
        model.unit_of(5)
    with pytest.raises(ModelError, match="slice"):
        model.slice(3, 3)
    assert issubclass(ModelError, ElasticPipeError)
    assert issubclass(ModelError, ValueError)


def test_slice_shares_modules_and_is_plain_sequential() -> None:
    model = _toy()
    part = model.slice(1, 3)
    assert type(part) is nn.Sequential
    assert list(part) == [model[1], model[2]]
    assert type(model[0:2]) is nn.Sequential


@settings(max_examples=15, deadline=None)
@given(cuts=st.lists(st.integers(min_value=1, max_value=13), unique=True, max_size=4))
def test_vit_slices_compose_to_whole_model(cuts: list[int]) -> None:
    model = _tiny_vit()
    x = torch.randn(3, 1, 8, 8, dtype=torch.float64, generator=torch.Generator().manual_seed(1))
    bounds = [0, *sorted(cuts), model.num_sublayers]
    h = x
    for start, end in itertools.pairwise(bounds):
        h = model.slice(start, end)(h)
    torch.testing.assert_close(h, model(x), rtol=0, atol=0)


_CACHE: dict[str, SubLayerModel] = {}


def _tiny_vit() -> SubLayerModel:
    if "vit" not in _CACHE:
        _CACHE["vit"] = vit("vit-tiny", dtype=torch.float64).eval()
    return _CACHE["vit"]


def test_vit_tiny_structure() -> None:
    model = _tiny_vit()
    assert model.layer_names[:3] == ("embed", "block0.attn", "block0.mlp")
    assert model.layer_names[-1] == "head"
    assert model.num_sublayers == 14
    assert model.unit_ends == (3, 5, 7, 9, 11, 13)
    x = torch.randn(4, 1, 8, 8, dtype=torch.float64)
    assert model(x).shape == (4, 10)
    assert model(x).dtype == torch.float64
    # Every sub-layer maps one tensor to one tensor: (B, 17, 64) between all cut points.
    assert model.slice(0, 5)(x).shape == (4, 17, 64)


def test_vit_seeded_init_is_deterministic_and_leaves_global_rng() -> None:
    state = torch.random.get_rng_state()
    a, b, c = vit(seed=3), vit(seed=3), vit(seed=4)
    assert torch.equal(torch.random.get_rng_state(), state)
    for pa, pb in zip(a.parameters(), b.parameters(), strict=True):
        assert torch.equal(pa, pb)
    assert not torch.equal(a[1].qkv.weight, c[1].qkv.weight)
    # float64 holds exactly the float32 values
    d = vit(seed=3, dtype=torch.float64)
    assert torch.equal(d[1].qkv.weight, a[1].qkv.weight.double())


def test_vit_b16_published_parameter_count_on_meta() -> None:
    with torch.device("meta"):
        model = vit("vit-b16")
    # torchvision's vit_b_16 and the ViT paper: 86,567,656 parameters with a 1000-class head.
    assert sum(p.numel() for p in model.parameters()) == 86_567_656
    assert model.num_units == 12
    with torch.device("meta"):
        large = vit("vit-l16")
    assert sum(p.numel() for p in large.parameters()) == 304_326_632


def test_vit_config_validation_and_overrides() -> None:
    assert vit_config("vit-tiny", depth=4).depth == 4
    assert vit_config("vit-b16").seq_len == 197
    with pytest.raises(ModelError, match="vit-b16"):
        vit_config("vit-huge")
    with pytest.raises(ModelError, match="unknown ViTConfig fields"):
        vit_config("vit-tiny", width=3)
    with pytest.raises(ModelError, match="must divide image_size"):
        ViTConfig(image_size=8, patch_size=3, in_channels=1, num_classes=2, dim=8, depth=1, heads=2, mlp_dim=8)
    with pytest.raises(ModelError, match="depth"):
        vit_config("vit-tiny", depth=0)
    with pytest.raises(ModelError, match="dropout"):
        vit_config("vit-tiny", dropout=1.0)
    with pytest.raises(ModelError, match="activation"):
        vit_config("vit-tiny", act="swish")


def test_vit_trains_on_cpu() -> None:
    model = vit("vit-tiny", depth=2, seed=0)
    gen = torch.Generator().manual_seed(0)
    x = torch.randn(16, 1, 8, 8, generator=gen)
    y = torch.randint(0, 10, (16,), generator=gen)
    opt = torch.optim.Adam(model.parameters(), lr=1e-3)
    losses = []
    for _ in range(20):
        loss = nn.functional.cross_entropy(model(x), y)
        opt.zero_grad()
        loss.backward()
        opt.step()
        losses.append(loss.item())
    assert losses[-1] < 0.5 * losses[0]


@settings(max_examples=30, deadline=None)
@given(data=st.data())
def test_unit_helpers_agree(data: st.DataObject) -> None:
    n = data.draw(st.integers(min_value=2, max_value=12))
    ends = sorted(data.draw(st.sets(st.integers(min_value=1, max_value=n - 1), min_size=1)))
    model = SubLayerModel([(f"l{i}", nn.Identity()) for i in range(n)], ends)
    # prefix_len is strictly increasing, starts at 0 and ends at the head
    prefixes = [model.prefix_len(k) for k in range(model.num_units + 1)]
    assert prefixes[0] == 0
    assert prefixes[-1] == model.head_start() == ends[-1]
    assert all(a < b for a, b in itertools.pairwise(prefixes))
    # every sub-layer before the head lies in exactly the unit whose bounds contain it
    for i in range(n):
        unit = model.unit_of(i)
        if unit is None:
            assert i >= model.head_start()
        else:
            start, end = model.unit_bounds(unit)
            assert start <= i < end
            assert prefixes[unit] == start
