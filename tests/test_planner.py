"""The planner's pure core: model configs, cluster spec, cost pricing, step prediction and the per-epoch plan."""

from __future__ import annotations

import itertools
import json
import math
from dataclasses import replace

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from elastic_pipe import planner
from elastic_pipe.freeze import FreezeError
from elastic_pipe.models import ModelError, bert_config, gpt_config, vit, vit_config
from elastic_pipe.models.catalogue import shape_of
from elastic_pipe.planner import (
    H200,
    MODEL_SHAPES,
    ClusterSpec,
    GpuSpec,
    JobSpec,
    Mode,
    PlannerError,
    SubLayerCost,
    format_table,
    from_layer_costs,
    make_plan,
    model_costs,
    model_shape,
    model_work,
    parse_bytes,
    plan_model,
    plan_to_dict,
    predict_layout,
    predict_step,
    price,
    to_layer_costs,
)
from elastic_pipe.planner.step import gradient_sync_time, ring_allreduce_time, transfer_time
from elastic_pipe.schedule import generate, simulate
from elastic_pipe.types import ByteSizeError, ElasticPipeError, LayerCost, Layout

# --- model configs -------------------------------------------------------------------------------------------


def test_vit_b16_parameter_count_matches_torchvision() -> None:
    # torchvision's vit_b_16 reports 86,567,656 parameters.
    assert sum(w.params for w in model_work(model_shape("vit-b16"))) == 86_567_656


def test_bert_base_encoder_parameter_count_matches_hugging_face() -> None:
    # BertModel without its pooler: 108,891,648 parameters (the MLM head is priced separately).
    work = model_work(model_shape("bert-base"))
    assert sum(w.params for w in work if w.name != "head") == 108_891_648


def test_gpt2_small_parameter_count_matches_hugging_face() -> None:
    # GPT-2 small has 124,439,808 parameters with its LM head tied to the token table; a pipeline's last stage
    # holds its own copy of the table (vocab x hidden).
    c = model_shape("gpt2-small")
    total = sum(w.params for w in model_work(c))
    assert total - c.vocab * c.hidden == 124_439_808


def test_sub_layer_structure() -> None:
    work = model_work(model_shape("bert-large"))
    assert len(work) == 2 * 24 + 2
    assert [w.unit for w in work[:5]] == [0, 0, 0, 1, 1]
    assert work[-1].unit is None and work[-1].name == "head"
    assert work[1].name == "block0.attn" and work[2].name == "block0.mlp"


def test_attention_and_mlp_flops_are_the_textbook_counts() -> None:
    c = model_shape("gpt2-medium")
    attn, mlp = model_work(c)[1:3]
    t, d = c.seq_len, c.hidden
    assert attn.matmul_flops == 8 * d * d * t
    assert attn.attention_flops == 4 * t * t * d * 0.5  # causal: half the score matrix
    assert mlp.matmul_flops == 4 * d * c.ffn * t
    assert mlp.stored_bytes == 21 * t * d  # Korthikanti et al.: 19sh + LayerNorm's 2sh with f = 4h


def test_unknown_model_lists_valid_names() -> None:
    with pytest.raises(ModelError, match="vit-b16") as exc:
        model_shape("vit-x")
    assert isinstance(exc.value, ElasticPipeError) and isinstance(exc.value, ValueError)


def test_every_builtin_config_prices() -> None:
    for name in MODEL_SHAPES:
        costs = price(model_work(model_shape(name)), H200)
        assert all(c.forward > 0 and c.backward > 0 for c in costs), name


def test_seq_len_override() -> None:
    short = model_shape("bert-base").with_seq_len(128)
    assert short.seq_len == 128 and model_work(short)[1].output_bytes == 128 * 768 * 2
    with pytest.raises(ElasticPipeError, match="image"):
        model_shape("vit-b16").with_seq_len(100)
    with pytest.raises(ElasticPipeError, match="position table"):
        model_shape("bert-base").with_seq_len(1024)


def test_the_catalogue_reads_the_models_presets() -> None:
    # One statement of each model's facts: the preset that builds the module.
    vit_b16, gpt2 = vit_config("vit-b16"), gpt_config("gpt2")
    shape = model_shape("vit-b16")
    assert (shape.blocks, shape.hidden, shape.heads, shape.ffn) == (vit_b16.depth, vit_b16.dim, 12, vit_b16.mlp_dim)
    assert shape.seq_len == vit_b16.seq_len == 197
    assert model_shape("gpt2-small") == shape_of(gpt2, "gpt2-small")
    assert model_shape("bert-large").positions == bert_config("bert-large").max_positions == 512
    # The planner's old names are the catalogue itself, not a copy.
    assert planner.MODEL_CONFIGS is MODEL_SHAPES and planner.model_config is model_shape


def test_the_planner_prices_a_preset_outside_the_catalogue() -> None:
    tiny = shape_of(vit_config("vit-tiny"), "vit-tiny")
    model = vit("vit-tiny")
    assert sum(w.params for w in model_work(tiny)) == sum(p.numel() for p in model.parameters())


# --- cluster ---------------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("text", "expected"),
    [("16GiB", 16 * 2**30), ("80GB", 80 * 10**9), ("1.5e9", 1_500_000_000), ("512 MiB", 512 * 2**20), (4096, 4096)],
)
def test_parse_bytes(text: str | int, expected: int) -> None:
    assert parse_bytes(text) == expected


@pytest.mark.parametrize("text", ["", "lots", "-1GB"])
def test_parse_bytes_rejects(text: str) -> None:
    with pytest.raises(ByteSizeError):
        parse_bytes(text)


def test_a_gpu_of_zero_bytes_is_refused() -> None:
    # "0" is a byte size (elastic_pipe.types.parse_bytes); the GPU refuses it, as the planner's own parser did
    with pytest.raises(PlannerError, match="memory"):
        GpuSpec(memory=parse_bytes("0"))


def test_cluster_validation() -> None:
    with pytest.raises(PlannerError, match="multiple of gpus_per_node"):
        ClusterSpec(12, 8)
    with pytest.raises(PlannerError, match="gpus"):
        ClusterSpec(0)
    with pytest.raises(PlannerError, match="matmul_flops"):
        GpuSpec(matmul_flops=0)
    assert ClusterSpec(4, 8).gpus_on_a_node == 4 and ClusterSpec(64, 8).nodes == 8


# --- costs -------------------------------------------------------------------------------------------------------


def test_from_layer_costs_divides_by_batch_and_assigns_units() -> None:
    records = [LayerCost("a", params=10, forward=2.0, backward=4.0, activation_bytes=8, memory_bytes=160 + 80)] * 3
    costs = from_layer_costs(records, 4, unit_ends=[2])
    assert [c.unit for c in costs] == [0, 0, None]
    assert costs[0].forward == 0.5 and costs[0].backward == 1.0 and costs[0].output_bytes == 2.0
    assert costs[0].stored_bytes == 20.0  # (240 - 16 * 10 state bytes) / 4
    back = to_layer_costs(costs, 4)
    assert back[0].forward == 2.0 and back[0].memory_bytes == 240


@pytest.mark.parametrize("ends", [[2, 2], [0], [5]])
def test_from_layer_costs_rejects_bad_units(ends: list[int]) -> None:
    with pytest.raises(PlannerError, match="unit_ends"):
        from_layer_costs([LayerCost("a", forward=1.0)] * 3, 1, unit_ends=ends)


# --- step prediction ---------------------------------------------------------------------------------------------


def _uniform(n: int, *, forward: float = 1e-3, backward: float = 2e-3, host: float = 0.0) -> list[SubLayerCost]:
    return [
        SubLayerCost(
            f"l{i}",
            unit=i if i < n - 1 else None,
            params=0,
            forward=forward,
            backward=backward,
            frozen_forward=forward,
            output_bytes=0.0,
            stored_bytes=0.0,
            host_weight=host,
        )
        for i in range(n)
    ]


#: A GPU without any fixed per-step host cost: the step is the simulated schedule alone.
NO_FIXED_COSTS = GpuSpec(
    host_overhead=0.0, data_overhead=0.0, pass_overhead=0.0, optimizer_overhead=0.0, optimizer_sublayer_overhead=0.0
)


def test_ring_allreduce_formula() -> None:
    assert ring_allreduce_time(1e9, 1, 1e9, 1e-5) == 0.0
    assert ring_allreduce_time(1e9, 4, 1e10, 1e-5) == pytest.approx(2 * 3 / 4 * 0.1 + 6 * 1e-5)
    assert transfer_time(1e6, 1e9, 45e-6) == pytest.approx(45e-6 + 1e-3)


@pytest.mark.parametrize(("stages", "microbatches"), [(2, 4), (4, 8), (4, 4)])
def test_equal_stages_reproduce_the_1f1b_bubble(stages: int, microbatches: int) -> None:
    costs = _uniform(2 * stages)
    cluster = ClusterSpec(stages, gpu=NO_FIXED_COSTS)
    batch = 8 * microbatches
    pred = predict_step(
        [(c, Mode.ACTIVE) for c in costs], cluster, global_batch=batch, pipe_len=stages, microbatches=microbatches
    )
    per_mb = 2 * 8 * 3e-3  # two layers per stage, 8 samples, forward + backward per sample
    b = pred.breakdown
    assert pred.layers_per_stage == (2,) * stages
    assert b.compute == pytest.approx(microbatches * per_mb)
    assert b.bubble == pytest.approx((stages - 1) * per_mb)
    assert b.transfers == pytest.approx(0.0, abs=1e-12) or b.transfers > 0  # zero-byte messages still pay latency
    assert b.allreduce == 0.0 and b.optimizer == 0.0 and b.host == 0.0
    assert pred.step_time == pytest.approx(b.compute + b.bubble + b.transfers)


def test_fixed_step_costs_add_up_per_trained_sub_layer() -> None:
    # 4 sub-layers of 1M parameters, the first frozen, on 2 DDP replicas: 3 trained sub-layers on every rank.
    costs = [replace(c, params=10**6) for c in _uniform(4)]
    gpu = GpuSpec(
        host_overhead=0.0,
        data_overhead=1e-3,
        pass_overhead=2e-3,
        optimizer_overhead=3e-3,
        optimizer_sublayer_overhead=1e-4,
        memory_bandwidth=1e12,
    )
    cluster = ClusterSpec(2, gpu=gpu, sync_overhead=5e-4, sync_sublayer_overhead=2e-4, collective_latency=0.0)
    modes = [(costs[0], Mode.FROZEN)] + [(c, Mode.ACTIVE) for c in costs[1:]]
    b = predict_step(modes, cluster, global_batch=8, pipe_len=1, microbatches=1).breakdown
    grads = 3 * 10**6 * 4  # fp32 gradients of the trained sub-layers
    assert b.host == pytest.approx(3e-3)
    assert b.optimizer == pytest.approx(3e-3 + 3 * 1e-4 + 3 * 10**6 * 28 / 1e12)
    assert b.allreduce == pytest.approx(2 * 1 / 2 * grads / cluster.intra_node_bandwidth + 5e-4 + 3 * 2e-4)
    assert gradient_sync_time(grads, 3, 1, 1e9, cluster) == 0.0  # one replica: nothing to average
    assert gradient_sync_time(0.0, 0, 2, 1e9, cluster) == 0.0  # nothing trained on the rank


@pytest.mark.parametrize("key", ["data_overhead", "pass_overhead", "optimizer_overhead", "optimizer_sublayer_overhead"])
def test_gpu_spec_rejects_negative_fixed_costs(key: str) -> None:
    with pytest.raises(PlannerError, match=key):
        GpuSpec(**{key: -1e-3})


@pytest.mark.parametrize("key", ["sync_overhead", "sync_sublayer_overhead"])
def test_cluster_spec_rejects_negative_sync_costs(key: str) -> None:
    with pytest.raises(PlannerError, match=key):
        ClusterSpec(2, **{key: -1e-3})


def test_small_micro_batches_are_host_bound() -> None:
    costs = _uniform(4, forward=1e-6, backward=2e-6, host=1.0)
    cluster = ClusterSpec(1, gpu=GpuSpec(host_overhead=1e-3))
    pred = predict_step([(c, Mode.ACTIVE) for c in costs], cluster, global_batch=8, pipe_len=1, microbatches=2)
    assert pred.host_bound
    assert pred.breakdown.compute == pytest.approx(2 * 4 * 2e-3)  # 4 layers x 1 ms per pass x 2 passes x 2 mbs


def test_frozen_and_cached_entries() -> None:
    costs = _uniform(4)
    cluster = ClusterSpec(1, gpu=GpuSpec(host_overhead=0.0))
    modes = [(costs[0], Mode.CACHED), (costs[1], Mode.FROZEN), (costs[2], Mode.ACTIVE), (costs[3], Mode.ACTIVE)]
    pred = predict_step(modes, cluster, global_batch=10, pipe_len=1, microbatches=1, cache_seconds_per_sample=1e-4)
    assert pred.layers_per_stage == (3,)
    assert pred.breakdown.cache_reads == pytest.approx(1e-3)
    assert pred.breakdown.compute == pytest.approx(10 * (1e-3 + 2 * 3e-3))


def test_predict_step_rejects_bad_layouts() -> None:
    entries = [(c, Mode.ACTIVE) for c in _uniform(4)]
    with pytest.raises(PlannerError, match="divide"):
        predict_step(entries, ClusterSpec(4), global_batch=16, pipe_len=3, microbatches=3)
    with pytest.raises(PlannerError, match="micro-batches"):
        predict_step(entries, ClusterSpec(2), global_batch=2, pipe_len=2, microbatches=4)
    with pytest.raises(PlannerError, match="at least as many sub-layers"):
        predict_step(entries[:1], ClusterSpec(2), global_batch=8, pipe_len=2, microbatches=2)


# --- plans -------------------------------------------------------------------------------------------------------


def _vit_plan(**job: object) -> object:
    options: dict[str, object] = {"global_batch": 1024, "epochs": 10, "steps_per_epoch": 100}
    options.update(job)
    return plan_model("vit-b16", ClusterSpec(16, 8, GpuSpec(memory=parse_bytes("16GiB"))), JobSpec(**options))  # type: ignore[arg-type]


def test_plan_follows_the_alpha_schedule_and_only_compresses() -> None:
    plan = _vit_plan(pipe_len=8)
    assert [e.frozen for e in plan.epochs] == [0, 4, 7, 9, 10, 11, 11, 12, 12, 12]
    lengths = [e.pipe_len for e in plan.epochs]
    assert lengths[0] == 8 and all(b <= a for a, b in itertools.pairwise(lengths))
    assert all(e.pipe_len * e.replicas == 16 for e in plan.epochs)
    assert plan.epochs[0].step.step_time == pytest.approx(plan.freeze_only[0].step.step_time)
    assert plan.speedup > 1.0 and plan.speedup_over_freeze_only > 1.0
    assert plan.transitions == 6  # epochs 1, 2, 3, 4, 5, 7 change the frozen count (and maybe K)


def test_never_freezing_with_the_best_start_equals_static() -> None:
    plan = _vit_plan(policy="never", policy_options={})
    assert plan.speedup == pytest.approx(1.0)
    assert plan.transitions == 0 and plan.reshapes == 0


def test_ddp_when_the_model_fits_one_gpu_and_pipeline_when_not() -> None:
    never = {"policy": "never", "policy_options": {}}
    big = plan_model("vit-b16", ClusterSpec(2), JobSpec(512, 1, 10, **never))  # type: ignore[arg-type]
    assert big.epochs[0].pipe_len == 1 and big.epochs[0].step.microbatches == 1
    small_gpu = ClusterSpec(8, 8, GpuSpec(memory=parse_bytes("16GiB")))
    # The weights fit, the activations of 512 samples per GPU do not: DDP with gradient accumulation.
    accumulate = plan_model("vit-l16", small_gpu, JobSpec(4096, 1, 10, **never))  # type: ignore[arg-type]
    assert accumulate.epochs[0].pipe_len == 1 and accumulate.epochs[0].step.microbatches > 1
    # 1.5 billion parameters with Adam state (24 GB) cannot sit on one 16 GiB GPU: a pipeline.
    tight = plan_model("gpt2-xl", small_gpu, JobSpec(64, 1, 10, **never))  # type: ignore[arg-type]
    assert tight.epochs[0].pipe_len > 1
    assert max(tight.epochs[0].step.stage_memory) <= small_gpu.gpu.usable_memory


def test_cache_off_recomputes_and_is_slower() -> None:
    cached, plain = _vit_plan(pipe_len=8), _vit_plan(pipe_len=8, cache=False)
    assert all(e.cache_tier is None and e.cached == 0 for e in plain.epochs)
    assert plan_seconds(cached) < plan_seconds(plain)


def plan_seconds(plan: object) -> float:
    seconds: float = plan.seconds  # type: ignore[attr-defined]
    return seconds


def test_partition_boundaries_cover_the_model() -> None:
    plan = _vit_plan(pipe_len=8)
    for e in plan.epochs:
        bounds = e.boundaries
        assert bounds[-1] == len(plan.layer_names)
        assert bounds[0] == e.first_layer
        assert all(b > a for a, b in itertools.pairwise(bounds))


def test_plan_json_document() -> None:
    doc = plan_to_dict(_vit_plan(pipe_len=8))
    text = json.dumps(doc, allow_nan=False)
    back = json.loads(text)
    epoch = back["epochs"][3]
    for key in ("frozen", "pipe_len", "replicas", "microbatches", "throughput", "partition", "breakdown"):
        assert key in epoch
    assert set(epoch["breakdown"]) >= {"compute", "bubble", "transfers", "allreduce", "cache_reads"}
    assert back["speedup"] > 1 and back["transitions"] == 6 and "speedup_over_freeze_only" in back


def test_table_mentions_baselines() -> None:
    text = format_table(_vit_plan(pipe_len=8))
    assert "static baseline" in text and "freeze-only" in text and "speedup" in text


def test_explicit_frozen_schedule_and_errors() -> None:
    plan = _vit_plan(frozen=(0, 6, 6, 12, 12, 12, 12, 12, 12, 12), pipe_len=4)
    assert [e.frozen for e in plan.epochs][:4] == [0, 6, 6, 12]
    with pytest.raises(PlannerError, match="non-decreasing"):
        _vit_plan(frozen=(0, 6, 3, 12, 12, 12, 12, 12, 12, 12))
    with pytest.raises(PlannerError, match="one count per epoch"):
        _vit_plan(frozen=(0, 6))
    with pytest.raises(PlannerError, match="pipe_len=3"):
        _vit_plan(pipe_len=3)
    with pytest.raises(FreezeError):
        _vit_plan(policy="autofreeze", policy_options={})


def test_a_job_that_fits_nowhere() -> None:
    tiny = ClusterSpec(1, gpu=GpuSpec(memory=parse_bytes("4GiB"), reserved_memory=0))
    with pytest.raises(PlannerError, match="fits no layout"):
        plan_model("gpt2-xl", tiny, JobSpec(64, 2, 1))


def test_job_validation() -> None:
    with pytest.raises(PlannerError, match="global_batch"):
        JobSpec(0, 1, 1)
    with pytest.raises(PlannerError, match="schedule"):
        JobSpec(8, 1, 1, schedule="bogus")
    with pytest.raises(PlannerError, match="cache tier"):
        JobSpec(8, 1, 1, cache_tier="tape")


@pytest.mark.parametrize("schedule", ["gpipe", "zb1p", "interleaved"])
def test_other_schedules_plan(schedule: str) -> None:
    plan = _vit_plan(pipe_len=4, schedule=schedule, epochs=3)
    assert len(plan.epochs) == 3 and all(e.throughput > 0 for e in plan.epochs)


def test_thousand_gpus_plan() -> None:
    plan = plan_model("gpt2-medium", ClusterSpec(1024, 8), JobSpec(8192, 10, 10))
    assert len(plan.epochs) == 10 and math.isfinite(plan.speedup)


@settings(max_examples=12, deadline=None)
@given(
    gpus=st.sampled_from([1, 2, 4, 8, 16]),
    layers=st.integers(3, 12),
    alpha=st.floats(0.1, 0.9),
    per_gpu=st.sampled_from([8, 16, 32]),
)
def test_plan_invariants(gpus: int, layers: int, alpha: float, per_gpu: int) -> None:
    costs = [
        SubLayerCost(
            f"l{i}",
            unit=i if i < layers - 1 else None,
            params=1000 * (i + 1),
            forward=1e-4,
            backward=2e-4,
            frozen_forward=9e-5,
            output_bytes=1e4,
            stored_bytes=1e4,
        )
        for i in range(layers)
    ]
    job = JobSpec(per_gpu * gpus, 5, 10, policy_options={"alpha": alpha})
    plan = make_plan(costs, ClusterSpec(gpus, 8), job)
    frozen = [e.frozen for e in plan.epochs]
    assert frozen == sorted(frozen) and frozen[0] == 0
    lengths = [e.pipe_len for e in plan.epochs]
    assert lengths == sorted(lengths, reverse=True)
    for e in plan.epochs:
        assert e.pipe_len * e.replicas == gpus
        assert sum(e.step.layers_per_stage) == layers - e.first_layer
        b = e.step.breakdown
        assert b.total == pytest.approx(e.step.step_time) and min(b.compute, b.bubble, b.allreduce) >= 0
    # The elastic job starts from the best static layout, so its first epoch is the static one.
    assert plan.epochs[0].step.step_time == pytest.approx(plan.static[0].step.step_time)


def test_every_decision_is_explained() -> None:
    plan = _vit_plan(pipe_len=8)
    first, second = plan.epochs[0].why, plan.epochs[1].why
    assert first.startswith("start at the given pipe_len=8") and "K=8 x 2" in first
    assert second.startswith("froze units 0..3; no cache yet, recompute units 0..3 and write boundary 4")
    assert "K=1 x 16" in second and "beats K=2:" in second
    assert "read boundary 4 from the" in plan.epochs[2].why
    assert "transitions:" in format_table(plan) and plan_to_dict(plan)["epochs"][1]["why"] == second


def test_cache_filled_in_the_transition_is_read_from_the_first_epoch() -> None:
    cluster = ClusterSpec(2, 2)
    job = JobSpec(512, 3, 10, frozen=(0, 4, 4), pipe_len=1, microbatches=1, cache_fill="transition")
    plan = plan_model("vit-b16", cluster, job)
    e1, e2 = plan.epochs[1], plan.epochs[2]
    assert (e1.cached, e2.cached, e1.cache_tier) == (4, 4, "gpu")
    assert e1.step.step_time == pytest.approx(e2.step.step_time)  # no recompute, no write while training
    costs = price(model_work(model_shape("vit-b16")), cluster.gpu)
    prefix = [c for c in costs if c.unit is not None and c.unit < 4]
    per_sample = sum(c.frozen_forward for c in prefix) + prefix[-1].output_bytes / cluster.gpu_cache_bandwidth
    assert e1.transition_seconds == pytest.approx(job.samples_per_epoch * per_sample)
    assert e2.transition_seconds == 0.0
    assert "the transition fills boundary 4 in the gpu cache" in e1.why
    assert e1.seconds == pytest.approx(10 * e1.step.step_time + e1.transition_seconds)
    published = plan_model("vit-b16", cluster, replace(job, cache_fill="epoch")).epochs[1]
    assert published.cached == 0 and published.transition_seconds == 0.0
    assert published.step.step_time > e1.step.step_time  # recomputes units 0..3 and writes boundary 4


def test_job_spec_rejects_an_unknown_cache_fill() -> None:
    with pytest.raises(PlannerError, match="unknown cache fill 'later'"):
        JobSpec(64, 2, 10, cache_fill="later")


def test_a_reshape_must_pay_for_its_transition() -> None:
    kept = _vit_plan(pipe_len=8, steps_per_epoch=1, transition_seconds=1000.0)
    assert [e.pipe_len for e in kept.epochs] == [8] * 10 and kept.reshapes == 0
    assert "kept K=8: K=1 would save" in kept.epochs[1].why and "less than its 1000 s transition" in kept.epochs[1].why
    # Every epoch's stages cover the model up to its last sub-layer, cached sub-layers kept on stage 0 or not.
    for e in (*kept.epochs, *kept.freeze_only):
        assert e.boundaries[-1] == 26 and sum(e.step.layers_per_stage) == 26 - e.first_layer
    free = _vit_plan(pipe_len=8, steps_per_epoch=1, transition_seconds=0.0)
    assert free.reshapes >= 1 and free.epochs[1].pipe_len < 8


# --- virtual stages (issue 43): taken from the job, predicted beside one stage per rank, never chosen -------------


@pytest.mark.parametrize(("ranks", "microbatches", "virtual"), [(2, 4, 2), (4, 8, 2), (4, 8, 4)])
def test_equal_stages_reproduce_the_interleaved_bubble(ranks: int, microbatches: int, virtual: int) -> None:
    # 2 sub-layers per stage: a stage's micro-batch costs per_stage, a rank's v stages v * per_stage; the
    # interleaved bubble is the 1F1B bubble of a rank divided by v: (K - 1) * v * per_stage / v.
    costs = _uniform(2 * ranks * virtual)
    cluster = ClusterSpec(ranks, gpu=NO_FIXED_COSTS)
    pred = predict_step(
        [(c, Mode.ACTIVE) for c in costs],
        cluster,
        global_batch=8 * microbatches,
        pipe_len=ranks,
        microbatches=microbatches,
        schedule="interleaved",
        chunks=virtual,
    )
    per_stage = 2 * 8 * 3e-3
    b = pred.breakdown
    assert pred.chunks == virtual and pred.layers_per_stage == (2,) * (ranks * virtual)
    assert b.compute == pytest.approx(microbatches * virtual * per_stage, rel=1e-9)
    assert b.bubble == pytest.approx((ranks - 1) * per_stage, rel=1e-9)


@pytest.mark.parametrize(("ranks", "microbatches"), [(2, 4), (4, 8)])
def test_equal_stages_reproduce_the_gpipe_bubble(ranks: int, microbatches: int) -> None:
    costs = _uniform(2 * ranks)
    pred = predict_step(
        [(c, Mode.ACTIVE) for c in costs],
        ClusterSpec(ranks, gpu=NO_FIXED_COSTS),
        global_batch=8 * microbatches,
        pipe_len=ranks,
        microbatches=microbatches,
        schedule="gpipe",
    )
    per_mb = 2 * 8 * 3e-3
    assert pred.breakdown.bubble == pytest.approx((ranks - 1) * per_mb, rel=1e-9)
    assert pred.breakdown.bubble / (pred.breakdown.compute + pred.breakdown.bubble) == pytest.approx(
        (ranks - 1) / (microbatches + ranks - 1), rel=1e-9
    )


def test_job_takes_virtual_stages_the_schedule_accepts() -> None:
    assert JobSpec(8, 1, 1).chunks == 1 and JobSpec(8, 1, 1, schedule="interleaved").chunks == 2
    assert JobSpec(8, 1, 1, schedule="interleaved", virtual=3).chunks == 3
    assert JobSpec(8, 1, 1, schedule="gpipe", virtual=2).chunks == 2
    with pytest.raises(PlannerError, match=r"virtual=2: 1f1b holds one stage per rank"):
        JobSpec(8, 1, 1, virtual=2)
    with pytest.raises(PlannerError, match=r"virtual=1: interleaved needs chunks >= 2"):
        JobSpec(8, 1, 1, schedule="interleaved", virtual=1)
    with pytest.raises(PlannerError, match=r"JobSpec\.virtual must be an int"):
        JobSpec(8, 1, 1, virtual=0)


def _uniform_plan(**job: object) -> planner.Plan:
    options: dict[str, object] = {"global_batch": 64, "epochs": 1, "steps_per_epoch": 10, "frozen": (0,)}
    options.update(job)
    cluster = ClusterSpec(4, gpu=NO_FIXED_COSTS)
    return make_plan(_uniform(16), cluster, JobSpec(**options), model="uniform")  # type: ignore[arg-type]


def test_plan_trains_one_stage_per_rank_and_reports_the_interleaved_step_beside_it() -> None:
    plan = _uniform_plan(pipe_len=4, microbatches=4)
    assert len(plan.epochs) == 1 and plan.epochs[0].pipe_len == 4
    for e in plan.epochs:
        alt = e.interleaved
        assert e.virtual == 1 and alt is not None and alt.chunks == 2
        assert (alt.pipe_len, alt.microbatches, alt.replicas) == (e.pipe_len, e.step.microbatches, e.replicas)
        # same work, half the fill and drain: (K - 1) per-rank micro-batches become (K - 1) / 2
        assert alt.breakdown.compute == pytest.approx(e.step.breakdown.compute, rel=1e-9)
        assert alt.breakdown.bubble == pytest.approx(e.step.breakdown.bubble / 2, rel=1e-9)
    first = plan_to_dict(plan)["epochs"][0]
    assert first["virtual"] == 1 and first["interleaved"]["virtual"] == 2
    assert first["interleaved"]["step_time"] == plan.epochs[0].interleaved.step_time  # type: ignore[union-attr]
    assert "[v=2: " in format_table(plan)


def test_plan_with_virtual_stages_reports_v_and_no_alternative() -> None:
    plan = _uniform_plan(pipe_len=2, microbatches=4, schedule="interleaved", virtual=4)
    assert all(e.virtual == 4 and e.interleaved is None for e in plan.epochs)
    assert len(plan.epochs[0].step.layers_per_stage) == 8
    assert "[v=2: " not in format_table(plan)


# --- a layout as a run holds it (``plan --config``): K x v stages the layout rule cut, predicted as they stand -----


def _even_layout(ranks: int, microbatches: int, virtual: int, sublayers: int, frozen: int = 0) -> Layout:
    per = (sublayers - frozen) // (ranks * virtual)
    return Layout(frozen, ranks, 1, tuple(range(frozen, sublayers + 1, per)), microbatches, virtual=virtual)


@pytest.mark.parametrize(("ranks", "microbatches"), [(2, 4), (4, 8), (4, 4)])
def test_a_layout_with_more_stages_per_rank_has_the_simulators_smaller_bubble(ranks: int, microbatches: int) -> None:
    # 4 equal sub-layers per rank, cut into v = 1, 2, 4 stages per rank: the same work per rank, the same K and M
    costs = _uniform(4 * ranks)
    cluster = ClusterSpec(ranks, gpu=NO_FIXED_COSTS)
    mb = 8
    fractions = {}
    for schedule, v in (("1f1b", 1), ("interleaved", 2), ("interleaved", 4)):
        layout = _even_layout(ranks, microbatches, v, 4 * ranks)
        pred = predict_layout(costs, cluster, layout, schedule=schedule, global_batch=mb * microbatches)
        stage = 4 // v * mb  # sub-layers per stage x samples: seconds per micro-batch of 1 ms + 2 ms per sample
        sim = simulate(generate(schedule, ranks, microbatches, v), stage * 1e-3, stage * 2e-3)
        work = microbatches * 4 * mb * 3e-3  # one rank's forwards and backwards
        assert pred.chunks == v and pred.layers_per_stage == (4 // v,) * (ranks * v)
        assert pred.breakdown.compute == pytest.approx(work, rel=1e-9)
        assert pred.breakdown.bubble == pytest.approx(sim.makespan - work, rel=1e-9)
        fractions[v] = pred.breakdown.bubble_fraction
    # the textbook bubbles: (K - 1) / (v M + K - 1) of the span
    for v, fraction in fractions.items():
        assert fraction == pytest.approx((ranks - 1) / (v * microbatches + ranks - 1), rel=1e-9)
    assert fractions[1] > fractions[2] > fractions[4]


def test_a_layouts_frozen_prefix_sits_on_stage_0() -> None:
    costs = _uniform(10)
    cluster = ClusterSpec(2, gpu=NO_FIXED_COSTS)
    layout = _even_layout(2, 4, 2, 10, frozen=2)  # stages (2, 4, 6, 8, 10): stage 0 also recomputes sub-layers 0, 1
    recomputed = predict_layout(costs, cluster, layout, schedule="interleaved", global_batch=32)
    cached = predict_layout(costs, cluster, layout, schedule="interleaved", global_batch=32, cached=True)
    assert recomputed.layers_per_stage == cached.layers_per_stage == (4, 2, 2, 2)
    assert cached.step_time < recomputed.step_time
    assert predict_layout(costs, ClusterSpec(4, gpu=NO_FIXED_COSTS), replace(layout, replicas=2), schedule="gpipe",
                          global_batch=32).replicas == 2  # fmt: skip


def test_predict_layout_refuses_what_the_layout_cannot_run() -> None:
    costs = _uniform(8)
    layout = _even_layout(2, 4, 2, 8)
    cluster = ClusterSpec(2, gpu=NO_FIXED_COSTS)
    with pytest.raises(PlannerError, match=r"1f1b at K=2, v=2: 1f1b holds one stage per rank"):
        predict_layout(costs, cluster, layout, schedule="1f1b", global_batch=32)
    with pytest.raises(PlannerError, match=r"the layout occupies 2 GPUs, the cluster has 4"):
        predict_layout(costs, ClusterSpec(4), layout, schedule="interleaved", global_batch=32)
    with pytest.raises(PlannerError, match=r"stages end at sub-layer 8, but the costs describe 9"):
        predict_layout(_uniform(9), cluster, layout, schedule="interleaved", global_batch=32)
    with pytest.raises(PlannerError, match=r"unknown schedule 'v'"):
        predict_layout(costs, cluster, layout, schedule="v", global_batch=32)


def test_model_costs_price_every_sub_layer_by_its_flops() -> None:
    import torch

    model = vit(vit_config("vit-tiny", image_size=8, patch_size=4, in_channels=1, num_classes=10, depth=2))
    costs = model_costs(model, torch.zeros(2, 1, 8, 8), H200)
    assert [c.name for c in costs] == list(model.layer_names)
    assert [c.unit for c in costs] == [0, 0, 0, 1, 1, None]  # units end after each block, the head never freezes
    assert all(c.forward > 0 and c.backward == pytest.approx(2 * c.forward) for c in costs)
    assert costs[1].params == sum(p.numel() for p in list(model.children())[1].parameters())
