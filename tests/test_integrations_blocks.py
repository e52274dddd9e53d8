"""The trainer-independent parts of the integrations: block adapters, the decision rhythm, the optimizer state
saved in its original layout, the controller's probe on real HF blocks and its checks. Tiny models, no downloads."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from elastic_pipe import freeze
from elastic_pipe.integrations import (
    FreezeController,
    IntegrationError,
    decision_interval,
    expand_optimizer_state,
    find_blocks,
)

pytestmark = pytest.mark.filterwarnings("ignore::DeprecationWarning", "ignore::FutureWarning")


def _hf(name: str) -> nn.Module:
    transformers = pytest.importorskip("transformers")
    torch.manual_seed(0)
    small = {"num_hidden_layers": 3, "num_attention_heads": 2, "hidden_size": 16, "intermediate_size": 32}
    if name == "bert":
        return transformers.BertForSequenceClassification(transformers.BertConfig(vocab_size=50, **small))
    if name == "bert-base":
        return transformers.BertModel(transformers.BertConfig(vocab_size=50, **small))
    if name == "vit":
        config = transformers.ViTConfig(image_size=8, patch_size=4, num_channels=3, **small)
        return transformers.ViTForImageClassification(config)
    if name == "gpt2":
        return transformers.GPT2LMHeadModel(transformers.GPT2Config(vocab_size=50, n_layer=3, n_head=2, n_embd=16))
    if name == "llama":
        config = transformers.LlamaConfig(vocab_size=50, num_key_value_heads=2, **small)
        return transformers.LlamaForCausalLM(config)
    raise AssertionError(name)


def _encoder_layer() -> bool:
    """Whether this transformers keeps ViT's blocks at ``vit.encoder.layer`` (before 5) or ``vit.layers``."""
    try:
        import transformers
    except ImportError:
        return True
    return int(transformers.__version__.split(".")[0]) < 5


@pytest.mark.parametrize(
    ("name", "blocks", "embeddings"),
    [
        ("bert", "bert.encoder.layer", ["bert.embeddings"]),
        ("bert-base", "encoder.layer", ["embeddings"]),
        ("vit", "vit.encoder.layer" if _encoder_layer() else "vit.layers", ["vit.embeddings"]),
        ("gpt2", "transformer.h", ["transformer.wte", "transformer.wpe"]),
        ("llama", "model.layers", ["model.embed_tokens"]),
    ],
)
def test_the_adapters_find_hf_blocks_with_the_embeddings_in_the_first_unit(
    name: str, blocks: str, embeddings: list[str]
) -> None:
    model = _hf(name)
    found = find_blocks(model)
    layers = model.get_submodule(blocks)
    assert len(found) == 3
    assert found.outputs() == tuple(layers)
    assert found.units[0] == (*(model.get_submodule(e) for e in embeddings), layers[0])
    assert all(unit == (layer,) for unit, layer in zip(found.units[1:], layers[1:], strict=True))


def test_a_wrapped_model_is_found_inside_its_holder() -> None:
    holder = nn.Module()
    holder.model = _hf("bert")  # a LightningModule holding a HF model as self.model
    found = find_blocks(holder)
    assert found.where == "hf-bert at model"
    assert found.outputs() == tuple(holder.model.bert.encoder.layer)


def test_torchvision_vit_layout_freezes_its_parameters_with_the_first_block() -> None:
    vit = nn.Module()  # torchvision.models.VisionTransformer's attribute layout
    vit.conv_proj = nn.Conv2d(3, 8, 4, 4)
    vit.class_token = nn.Parameter(torch.zeros(1, 1, 8))
    vit.encoder = nn.Module()
    vit.encoder.pos_embedding = nn.Parameter(torch.zeros(1, 5, 8))
    vit.encoder.layers = nn.ModuleList([nn.Linear(8, 8) for _ in range(2)])
    vit.heads = nn.Linear(8, 2)
    found = find_blocks(vit)
    assert len(found) == 2 and found.outputs() == tuple(vit.encoder.layers)
    first = {id(p) for m in found.units[0] for p in m.parameters()}
    expected = [
        vit.class_token,
        vit.encoder.pos_embedding,
        *vit.conv_proj.parameters(),
        *vit.encoder.layers[0].parameters(),
    ]
    assert first == {id(p) for p in expected}
    freeze.freeze_modules(found.modules(0, 1), None)
    assert not vit.class_token.requires_grad and not vit.encoder.pos_embedding.requires_grad
    assert vit.encoder.layers[1].weight.requires_grad and vit.heads.weight.requires_grad


def test_a_user_function_lists_the_blocks_and_bad_answers_are_named() -> None:
    model = nn.Sequential(nn.Linear(2, 2), nn.Linear(2, 2), nn.Linear(2, 2))
    found = find_blocks(model, lambda m: [[m[0], m[1]], m[2]])
    assert found.where == "user" and found.units == ((model[0], model[1]), (model[2],))
    with pytest.raises(IntegrationError, match="no known block layout in Sequential"):
        find_blocks(model)
    with pytest.raises(IntegrationError, match="entry 1"):
        find_blocks(model, lambda m: [m[0], "block"])  # type: ignore[list-item]
    with pytest.raises(IntegrationError, match="no blocks"):
        find_blocks(model, lambda m: [])


def test_decision_interval_follows_the_policys_rhythm() -> None:
    assert decision_interval(freeze.Drift(4, total_steps=100), 10) == 2  # 4 decisions per epoch
    assert decision_interval(freeze.Drift(4, total_steps=100), 3) == 1
    assert decision_interval(freeze.ManualSchedule(4, {1: 2}), 10) == 10  # once per epoch
    assert decision_interval(freeze.ManualSchedule(4, {1: 2}), 10, decide_every=3) == 3
    with pytest.raises(IntegrationError, match="decide_every must be an integer >= 1 or None, got 0"):
        decision_interval(freeze.Never(4), 10, decide_every=0)


def _adamw_step(params: list[nn.Parameter]) -> None:
    for p in params:
        p.grad = torch.ones_like(p) if p.requires_grad else None


def test_saved_optimizer_state_keeps_the_original_layout_and_loads_into_a_fresh_optimizer() -> None:
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(2, 3), nn.Linear(3, 3), nn.Linear(3, 1))
    groups = [[*model[0].parameters(), model[1].weight], [model[1].bias, *model[2].parameters()]]
    optimizer = torch.optim.AdamW([{"params": g} for g in groups], lr=0.1)
    layout = [list(g["params"]) for g in optimizer.param_groups]
    _adamw_step(list(model.parameters()))
    optimizer.step()
    freeze.freeze_modules([model[0]], optimizer)  # the first group loses two of its three parameters
    _adamw_step(list(model.parameters()))
    optimizer.step()
    now = [list(g["params"]) for g in optimizer.param_groups]
    saved = expand_optimizer_state(optimizer.state_dict(), now, layout)
    assert [len(g["params"]) for g in saved["param_groups"]] == [3, 3]
    assert sorted(saved["state"]) == [2, 3, 4, 5]  # model[0]'s two parameters are listed without state
    # a resumed run: a fresh model and optimizer over everything, the expanded state, then the restored freeze
    torch.manual_seed(0)
    again = nn.Sequential(nn.Linear(2, 3), nn.Linear(3, 3), nn.Linear(3, 1))
    fresh_groups = [[*again[0].parameters(), again[1].weight], [again[1].bias, *again[2].parameters()]]
    fresh = torch.optim.AdamW([{"params": g} for g in fresh_groups], lr=0.1)
    fresh.load_state_dict(saved)
    freeze.freeze_modules([again[0]], fresh)
    original, restored = optimizer.state_dict(), fresh.state_dict()
    assert [g["params"] for g in original["param_groups"]] == [g["params"] for g in restored["param_groups"]]
    for k, state in original["state"].items():
        assert {n: torch.as_tensor(v).tolist() for n, v in state.items()} == {
            n: torch.as_tensor(v).tolist() for n, v in restored["state"][k].items()
        }
    with pytest.raises(IntegrationError, match="2 param groups now, 1 when training began"):
        expand_optimizer_state(optimizer.state_dict(), now, layout[:1])


def test_the_controller_probes_each_hf_block_and_refuses_a_policy_of_the_wrong_size() -> None:
    model = _hf("llama")
    controller = FreezeController()  # the default policy: drift, which reads the probe
    controller.locate(model)
    policy = controller.build_policy(total_steps=40)
    assert policy.name == "drift" and policy.num_layers == 3
    assert getattr(policy, "total_steps", None) == 40  # filled in with the run's length
    batch = torch.randint(0, 50, (4, 6))
    controller.set_probe(lambda: model(input_ids=batch))
    outputs = controller._probe_outputs()
    assert sorted(outputs) == [0, 1]  # the default cap keeps the top block training: it is not watched
    assert all(h.shape == (4, 6, 16) for h in outputs.values())
    assert model.training  # the probe ran in eval mode and put the mode back
    wrong = FreezeController(freeze.Never(5))
    wrong.locate(model)
    with pytest.raises(IntegrationError, match="num_layers=5 units, but the model has 3 blocks"):
        wrong.build_policy(total_steps=10)


def test_a_controller_in_a_plain_loop_freezes_at_epoch_boundaries() -> None:
    torch.manual_seed(0)
    model = nn.Sequential(
        nn.Linear(4, 8), *(nn.Sequential(nn.Linear(8, 8), nn.Tanh()) for _ in range(3)), nn.Linear(8, 1)
    )
    blocks = lambda m: [[m[0], m[1]], m[2], m[3]]  # noqa: E731
    x, y = torch.randn(32, 4), torch.randn(32, 1)

    full = FreezeController(freeze.ManualSchedule(3, {1: 1, 2: 2}), blocks=blocks)
    full.locate(model)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    full.attach_optimizer(optimizer)
    full.build_policy(12)
    full.set_rhythm(steps_per_epoch=4, total_steps=12)
    full.start(resumed=False)
    for step in range(1, 13):
        loss = (model(x) - y).square().mean()
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        full.step_end(step)
    assert len(optimizer.param_groups[0]["params"]) == 4  # the head and the third block remain
    assert [(e["step"], e["frozen"]) for e in full.events] == [(4, 1), (8, 2)]
    assert all(not p.requires_grad for m in full.blocks.modules(0, 2) for p in m.parameters())  # type: ignore[union-attr]
    with pytest.raises(IntegrationError, match="version None, expected 1"):
        full.load_state_dict({})
