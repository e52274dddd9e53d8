"""The probe a probe-driven freeze policy reads (:class:`elastic_pipe.freeze.Drift`): how much each freeze unit's
output on a fixed batch changed since the previous decision point, measured through the current layout.

The probe is the first :data:`PROBE_SAMPLES` samples of the evaluation split (no augmentation, so only the weights
move the result). At a decision point replica 0's pipeline runs it in eval mode: stage 0 reads the inputs and runs
the frozen prefix and its own sub-layers (while the prefix's weights are released, it starts from the prefix outputs
kept for the evaluation instead, :meth:`~.prefix.FrozenPrefix.eval_input`, as the evaluation does), every stage
sends its output to the next one (point to point, as the evaluation does), and each rank hands the outputs of the
watched units that end on it to its stage's :class:`~elastic_pipe.freeze.OutputDrift`. The other replicas hold the
same weights and add nothing. One all-reduce on the control group sums the pieces (squares of disjoint parts add),
and rank 0 turns them into the relative changes the policy observes.

A rank keeps the outputs of the units it holds, so after a transition (units change owners) every rank takes a new
baseline in the new layout at once (:func:`baseline`); the weights are those the decision was made with, so the
next decision point compares with the same point in time. Cost: one forward of the probe through the watched units
per decision point (two when the layout changes); nothing per step. Stage 0 reads the probe's inputs once per layout, in
this process: through the held-out split's loaders it would replace the evaluation's loader, and fork its workers
again, at every decision point. Each unit's forward (the part of it on this
stage) is a segment of the stage's :class:`~.forward_graphs.ForwardGraphs`: on a GPU, eager at a layout's baseline,
captured at its first decision point and replayed after (``[train] cuda_graphs = "off"``: always eager).

A checkpoint keeps the outputs (:func:`kept`: replica 0's stage ``s`` writes those of the units ending on it into
the stage's shard) and a resume puts them back (:func:`restore`) instead of taking a new baseline, so a run resumed
from a step checkpoint between two decision points measures, at the next one, exactly the drift the uninterrupted
run measures. A checkpoint without them (written before they were kept) falls back to :func:`baseline` at the
resume: the first interval after it then spans only the steps since the checkpoint.
"""

from __future__ import annotations

import functools
import itertools
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING

import torch
import torch.distributed as dist

from elastic_pipe import freeze
from elastic_pipe.orchestrator.errors import OrchestratorError
from elastic_pipe.orchestrator.evaluation import recv_activation, send_activation

if TYPE_CHECKING:
    from elastic_pipe.orchestrator.context import RunContext
    from elastic_pipe.orchestrator.prefix import FrozenPrefix
    from elastic_pipe.orchestrator.stage.runtime import StageRuntime

__all__ = ["baseline", "kept", "measure", "restore"]

#: Samples in the probe batch: enough numbers for a stable relative change (16 x tokens x width), few enough that
#: its forward costs about 1% of a decision interval's training work in the measured tasks.
PROBE_SAMPLES = 16


def _segment(sublayers: Sequence[torch.nn.Module], lo: int, hi: int) -> torch.nn.Module:
    return torch.nn.Sequential(*sublayers[lo:hi])


def _inputs(ctx: RunContext, stage: StageRuntime, rows: int) -> torch.Tensor:
    """The probe batch's inputs on the device: read at the layout's first probe, in this process (a few rows: no
    loader, so the held-out split's kept loaders, and their workers, stay as the evaluation left them), then kept
    on the stage for the layout's later probes."""
    if stage.probe_inputs is None:
        stage.probe_inputs = ctx.eval_set.input_rows(0, rows).to(ctx.device)
    return stage.probe_inputs


@torch.no_grad()
def _unit_outputs(ctx: RunContext, stage: StageRuntime, prefix: FrozenPrefix, watched: int) -> dict[int, torch.Tensor]:
    """The probe outputs of units ``frozen .. watched - 1`` that end on this rank (replica 0 only; point to point
    within its pipeline). A rank holding several stages runs them in turn, the probe travelling down the stages."""
    layout = stage.layout
    frozen_units = sum(1 for end in ctx.unit_ends if end <= layout.frozen)
    if stage.replica != 0 or frozen_units >= watched:  # the same answer on every rank of the pipeline
        return {}
    plan = ctx.plan(layout)
    pipeline = plan.pipeline_groups[0]
    group = ctx.groups.pipeline_group(layout.pipe_len)
    placement, position = stage.placement, stage.stage
    ranks = placement.ranks
    ends = {end: u for u, end in enumerate(ctx.unit_ends)}
    # the last sub-layer a later stage needs: past the last watched unit nothing is sent
    needed = ctx.unit_ends[watched - 1]
    rows = list(range(min(PROBE_SAMPLES, len(ctx.eval_set))))
    out: dict[int, torch.Tensor] = {}
    sublayers = ctx.sublayers
    graphs = stage.probe_graphs
    assert graphs is not None  # built with the drift
    x: torch.Tensor | None = None
    for s, (lo, hi) in zip(placement.stages_of(position), placement.ranges_of(position), strict=True):
        if s > 0 and lo >= needed:
            break
        if s == 0 and prefix.released > 0:
            # the prefix's weights are released and its evaluation outputs kept (the probe is evaluation rows):
            # start from them, as the evaluation does; right after a transition they are still at the old boundary,
            # and the newly frozen sub-layers after it are resident (the transition carries the outputs on after the
            # baseline)
            x, start = prefix.eval_input(torch.tensor(rows, dtype=torch.int64))
            assert prefix.released <= start <= layout.frozen, (prefix.released, start, layout)
        elif s == 0:
            x, start = _inputs(ctx, stage, len(rows)), 0  # stage 0 runs the frozen prefix too
        elif ranks[s - 1] != position:
            x, start = recv_activation(pipeline[ranks[s - 1]], ctx.device, group), lo
        else:  # the stage before ran on this rank (one rank holding several stages)
            start = lo
        assert x is not None
        stop = min(hi, needed)
        # one segment per unit (cut at the stage's ends), in eval mode, each replayed as a CUDA graph once captured
        # (.forward_graphs)
        bounds = [start, *sorted(e for e in ctx.unit_ends if start < e < stop), stop] if start < stop else []
        for lo_j, hi_j in itertools.pairwise(bounds):
            x = graphs.run((lo_j, hi_j), x, functools.partial(_segment, sublayers, lo_j, hi_j))
            u = ends.get(hi_j)
            if u is not None and frozen_units <= u < watched:
                out[u] = x  # a graph's static output: measure copies what it keeps
        if hi < needed and s + 1 < placement.num_stages and ranks[s + 1] != position:
            send_activation(x, pipeline[ranks[s + 1]], group)
    return out


def _measure_sums(
    ctx: RunContext, stage: StageRuntime, prefix: FrozenPrefix
) -> tuple[tuple[float, ...], tuple[float, ...]]:
    policy = ctx.parts.policy
    n_units = len(ctx.unit_ends)
    assert stage.drift is not None  # built for a policy that needs the probe
    outputs = _unit_outputs(ctx, stage, prefix, freeze.signal_layers(policy))
    diff_sq, ref_sq = stage.drift.measure(outputs, n_units)
    flat = torch.tensor([*diff_sq, *ref_sq], dtype=torch.float64)
    dist.all_reduce(flat, group=ctx.groups.control_group)
    values = flat.tolist()
    return tuple(values[:n_units]), tuple(values[n_units:])


def measure(ctx: RunContext, stage: StageRuntime, prefix: FrozenPrefix) -> tuple[float, ...] | None:
    """Each unit's relative probe-output change since the previous measurement, the same on every rank (a
    collective); ``None`` on every rank when the policy reads no probe."""
    if stage.drift is None:
        return None
    return freeze.relative_change(*_measure_sums(ctx, stage, prefix))


def baseline(ctx: RunContext, stage: StageRuntime, prefix: FrozenPrefix) -> None:
    """Take the probe outputs of a freshly built stage as the next comparison's baseline (a collective; nothing
    when the policy reads no probe)."""
    if stage.drift is not None:
        _measure_sums(ctx, stage, prefix)


def kept(stage: StageRuntime) -> dict[str, dict[str, torch.Tensor]] | None:
    """This rank's kept probe outputs for a checkpoint (no collective): ``{str(stage): {str(unit): CPU tensor}}`` on
    replica 0 (string keys, as a checkpoint's tensor paths are), ``{}`` on the other replicas, ``None`` when the
    policy reads no probe."""
    if stage.drift is None:
        return None
    if stage.replica != 0:
        return {}
    return {str(stage.stage): {str(u): h for u, h in stage.drift.state_dict().items()}}


def restore(ctx: RunContext, stage: StageRuntime, saved: Mapping[str, Mapping[str, torch.Tensor]]) -> None:
    """Keep the saved probe outputs as the next comparison's baseline, instead of :func:`baseline` (no collective;
    nothing when the policy reads no probe).

    Args:
        saved: by stage (a string), the kept outputs of that stage's units by unit (a string) - at least this
            rank's stage when it is on replica 0 (:func:`kept`, or a sharded checkpoint's view of every stage's).

    Raises:
        OrchestratorError: ``saved`` lacks this rank's stage, or an entry of it is not a unit index (named).
        FreezeError: a unit outside the model's, or an output that is not a floating-point tensor (named).
    """
    if stage.drift is None:
        return
    if stage.replica != 0:  # only replica 0 probes: the other replicas keep nothing, as after a baseline
        stage.drift.reset()
        return
    piece = saved.get(str(stage.stage))  # a sharded checkpoint reads (and checks) this stage's piece only
    if piece is None:
        raise OrchestratorError(f"no saved probe outputs of stage {stage.stage}: the state has {sorted(saved)}")
    bad = [u for u in piece if not str(u).isdigit()]
    if bad:
        raise OrchestratorError(f"stage {stage.stage}'s saved probe outputs hold entry {bad[0]!r}, not a unit index")
    outputs = {int(u): h for u, h in piece.items()}
    stage.drift.load_state_dict(outputs, num_layers=len(ctx.unit_ends), device=ctx.device)
