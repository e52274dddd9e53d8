"""A transition does only its own work (issue 40), counted on the CPU: per sub-layer forward calls and rows, cache
writes, dataset items read and bytes copied between ranks, during every transition of small runs.

The rule: freezing ``k`` more units over a complete activation cache runs those units' forward once per cached
entry (training entries, and the evaluation entries kept while the prefix is released), moves nothing else,
recomputes no earlier prefix, re-reads no dataset and builds only the runner of the stage that changed. The first
transition of a run (nothing cached yet) fills the cache: the prefix once per training sample (and per evaluation
sample when the prefix is released), each sample read once.

The runs: the tiny ViT (8 sub-layers: the embedding, two per block, the head; units end at 3, 5, 7) on 160
digits, ``cache = "on"``, one stage; on 1 rank and on 2 ranks (2 replicas, whose stage-0 ranks share the fill);
the frozen prefix released (the default once the cache serves it) or kept resident (the cache on the disk tier,
which :func:`~elastic_pipe.orchestrator.prefix.residency.eligible` refuses; on 2 ranks also a device tier with the
release patched off); transitions at epoch ends (``manual``: 1 unit, then 2 more) and inside epochs (FreezeOut,
``decide_every = 2``: one unit at a time), one run of the default policy (``drift``) whose probe forwards (the
measure at the decision point and the new baseline) are counted in a part of their own, and, on 2 ranks, a
transition that also compresses 2 stages into 1 stage x 2 replicas (the new stage-0 rank gets the carried
entries). Two processes run them all: a 1-rank job, then a 2-rank job (about 30 s on 2 cores).

Expected counts are derived from the config and the layouts (training and evaluation sizes, the replicas' fill
chunks, which the carry runs too, and the evaluation's chunk size); every count is compared exactly. Two cases did
more than the rule allows when this guard was written (2 ranks over a node-shared disk tier, and the resident
re-layout: a peer re-read its samples and ran the whole prefix); ``prefix.shared.fill_shared`` now carries every
entry on the holders and sends the rest from peer 0, and both pass.
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

import pytest

import tiny_vit
from elastic_pipe.testing import RankContext, run_distributed, run_tasks

pytestmark = [pytest.mark.distributed, pytest.mark.slow]  # the two jobs: ~35 s on 2 shared cores

#: 160 digits: 128 training samples (4 steps of 32 an epoch), 32 held out.
SAMPLES = 160
GLOBAL_BATCH = 32
#: Sub-layers of the tiny ViT (embedding, 2 per block, head).
SUBLAYERS = 8

#: How each run freezes: at epoch ends, inside epochs, or by the default policy (its probe counted apart).
WHEN = {
    # before epoch 1: unit 0 (sub-layers 0:3); before epoch 2: units 1 and 2 (3:7)
    "epoch_end": {"policy": "manual", "options": {"schedule": {1: 1, 2: 3}}, "decide_every": 0},
    # FreezeOut over the run's 12 steps, t0 = 1/6: units stop at steps 2, 5.3 and 8.7, so the decision points
    # after steps 2, 6 and 10 (each after step 2 of its epoch) freeze one unit each
    "mid_epoch": {"policy": "freezeout", "options": {"t0": 1 / 6, "total_steps": 12}, "decide_every": 2},
    # every layer counts as still (threshold), one unit per decision point: steps 2 (inside epoch 0), 4 (its end),
    # 6 (inside epoch 1)
    "drift": {"policy": "drift", "options": {"threshold": 1e9, "max_step": 1, "max_fraction": 1.0}, "decide_every": 2},
    # 2 ranks as 2 stages, compressed to 1 stage x 2 replicas by the second transition (halving): rank 1 becomes a
    # stage-0 rank that holds no cache entry
    "relayout": {"policy": "manual", "options": {"schedule": {1: 1, 2: 3}}, "decide_every": 0},
}

#: The transitions each run makes: (old frozen, new frozen, steps of its epoch done before it).
TRANSITIONS = {
    "epoch_end": [(0, 3, 0), (3, 7, 0)],
    "mid_epoch": [(0, 3, 2), (3, 5, 2), (5, 7, 2)],
    "drift": [(0, 3, 2), (3, 5, 0), (5, 7, 2)],
    "relayout": [(0, 3, 0), (3, 7, 0)],
}

#: Where the cache lives and whether the prefix is released: "released" (device tier, released once the cache
#: serves it), "disk" (the disk tier only: the prefix stays resident), "kept" (device tier, release patched off).
RESIDENCY = ("released", "disk", "kept")


def _tables(when: str, residency: str, world: int, disk: str) -> dict[str, Any]:
    pipeline: dict[str, Any] = {"microbatches": 1, "pipe_len": 1, "cache": "on"}
    if when == "relayout":
        pipeline.update(pipe_len=2, microbatches=2, compression="halving", solver="optimal")
    if residency == "disk":
        pipeline["cache_tiers"] = {"device": 0, "disk": disk}
    return {
        "model": tiny_vit.model_table(),
        "train": {"dtype": "float64", "epochs": 3, "global_batch": GLOBAL_BATCH, "optimizer": "sgd", "lr": 0.05},
        "freeze": WHEN[when],
        "pipeline": pipeline,
        "launch": {"nproc_per_node": world},
        "log": {"progress": False},
    }


class _Digits:
    """The first ``n`` digits as a map-style dataset (read item by item, so that reads can be counted)."""

    def __init__(self, n: int) -> None:
        from elastic_pipe.data import load_digits

        d = load_digits()
        self.x, self.y = d.inputs[:n], d.labels[:n]

    def __len__(self) -> int:
        return int(self.x.shape[0])

    def __getitem__(self, i: int) -> Any:
        return self.x[i], int(self.y[i])


def _run(ctx: RankContext, when: str, residency: str, disk: str) -> dict[str, Any]:
    """One training run on this rank; the work of each transition, counted (plain data)."""
    from elastic_pipe import freeze
    from elastic_pipe.orchestrator import ElasticTrainer, config_from_tables
    from elastic_pipe.orchestrator.prefix import residency as prefix_residency
    from elastic_pipe.orchestrator.stage import probe
    from elastic_pipe.orchestrator.stage import runtime as stage_runtime
    from elastic_pipe.testing.work import CountedDataset, count_work

    data = CountedDataset(_Digits(SAMPLES))
    records: list[dict[str, Any]] = []
    unchanged: list[dict[str, Any]] = []
    eligible = prefix_residency.eligible
    if residency == "kept":
        prefix_residency.eligible = lambda *args: False  # type: ignore[assignment]
    config = config_from_tables(_tables(when, residency, ctx.world_size, disk))
    try:
        with ElasticTrainer(config, data=data, quiet=True) as trainer:
            transition = trainer.transition

            def counted(*, epoch_step: int = 0, before: Any = None) -> Any:
                old, released = trainer.state.layout, trainer.prefix.released
                measure, baseline = probe.measure, probe.baseline
                with count_work(
                    trainer.ctx.model,
                    cache=trainer.prefix.cache,
                    dataset=data,
                    control=trainer.ctx.groups.control_group,
                    calls={"runners_built": (stage_runtime, "build_runner")},
                ) as work:

                    def in_probe(fn: Any) -> Any:
                        def probed(*args: Any, **kwargs: Any) -> Any:
                            with work.part("probe"):
                                return fn(*args, **kwargs)

                        return probed

                    def paused(leave: Any) -> None:  # the step loop leaving its batches: counted apart
                        with work.part("pause"):
                            leave()

                    probe.measure, probe.baseline = in_probe(measure), in_probe(baseline)
                    try:
                        event = transition(epoch_step=epoch_step, before=before and (lambda: paused(before)))
                    finally:
                        probe.measure, probe.baseline = measure, baseline
                if event is None:  # a decision point that changed nothing
                    unchanged.append({"epoch_step": epoch_step, "work": work.to_dict()})
                else:
                    new = trainer.state.layout
                    example = trainer.ctx.prefix_example(new.frozen)
                    ids = trainer.ctx.train_set.sample_ids.to("cpu")
                    records.append(
                        {
                            "old": old.frozen,
                            "new": new.frozen,
                            "epoch_step": epoch_step,
                            "replicas": new.replicas,
                            "released_before": released,
                            "released_after": trainer.prefix.released,
                            "pipe_len": new.pipe_len,
                            "bytes_moved": event.bytes_moved,
                            "entry_bytes": example[0].numel() * example.element_size(),
                            # training samples cached at the new boundary, as this rank sees its cache
                            "entries": int(trainer.prefix.cache.cached(ids, new.frozen).sum()),
                            "work": work.to_dict(),
                        }
                    )
                return event

            trainer.transition = counted  # type: ignore[method-assign]
            trainer.fit()
            sizes = {"train": len(trainer.ctx.train_set), "eval": len(trainer.ctx.eval_set)}
            # the units the policy may freeze (the probe watches them), and where each unit ends
            units = {"watched": freeze.signal_layers(trainer.parts.policy), "ends": list(trainer.ctx.unit_ends)}
    finally:
        prefix_residency.eligible = eligible
    return {"records": records, "unchanged": unchanged, "sizes": sizes, "units": units}


def _tasks(world: int, root: str) -> dict[Any, Any]:
    cases = [(when, res) for res in RESIDENCY for when in ("epoch_end", "mid_epoch")]
    if world == 1:
        cases = [c for c in cases if c[1] != "kept"] + [("drift", "released")]  # "kept" is "disk" on one rank
    else:
        cases += [("relayout", "released"), ("relayout", "kept")]
    return {case: (_run, (*case, str(Path(root) / f"{world}-{case[0]}-{case[1]}"))) for case in cases}


@pytest.fixture(scope="module")
def runs(tmp_path_factory: pytest.TempPathFactory) -> dict[tuple[int, str, str], list[dict[str, Any]]]:
    """Every run, by (ranks, when, residency): the per-rank results. One 1-rank job and one 2-rank job (starting
    the ranks costs about as much as a run)."""
    root = str(tmp_path_factory.mktemp("transition-work"))
    out: dict[tuple[int, str, str], list[dict[str, Any]]] = {}
    for world in (1, 2):
        per_rank = run_distributed(run_tasks, world, _tasks(world, root), timeout=400)
        for case in per_rank[0]:
            out[(world, *case)] = [r[case] for r in per_rank]
    return out


# ------------------------------------------------------------------------------------------------ expectations
def _chunks(train: int, replicas: int, rank: int) -> list[int]:
    """Sizes of the fill chunks rank ``rank`` computes when the replicas' stage-0 ranks share a pass
    (``prefix.shared.fill_shared``: chunks of a replica's batch, dealt round-robin)."""
    chunk = GLOBAL_BATCH // replicas
    starts = list(range(0, train, chunk))
    return [min(chunk, train - s) for s in starts[rank::replicas]]


def _expected(rec: dict[str, Any], sizes: dict[str, int], residency: str, rank: int) -> dict[str, Any]:
    """What the transition ``rec`` may do on rank ``rank``: the rule of the module docstring, in each path's terms."""
    from elastic_pipe.orchestrator.prefix.residency import EVAL_CHUNK, KEEPER

    old, new, replicas, entry = rec["old"], rec["new"], rec["replicas"], rec["entry_bytes"]
    train, held_out = sizes["train"], sizes["eval"]
    released = residency == "released"  # released once the cache serves the prefix
    calls, rows = [0] * SUBLAYERS, [0] * SUBLAYERS
    exp: dict[str, Any] = {"items_read": 0, "cache_put": 0, "cache_carried": 0, "cache_got": 0, "copied": {}}
    shared = replicas > 1
    mine = _chunks(train, replicas, rank) if shared else [GLOBAL_BATCH] * math.ceil(train / GLOBAL_BATCH)
    own = sum(mine) if shared else train
    lo = 0 if old == 0 else old  # a fill runs the whole prefix; a carry only the newly frozen sub-layers
    if old == 0:  # the fill: this rank's chunks through the prefix, read from the dataset
        fill_calls = len(mine)
        exp["items_read"] = own
        exp["cache_put"] = train
        fill_rows = own
    else:  # the carry: every entry this rank carries, in place, through the newly frozen sub-layers
        carried = own if shared and not released else train
        # a replica's batch per forward: the size the steps ran
        fill_calls, fill_rows = math.ceil(carried / (GLOBAL_BATCH // replicas)), carried
        exp["cache_carried"] = carried
        if shared and not released:  # the other peers' rows arrive by the all-gather and are stored
            exp["cache_put"] = train - own
    for j in range(lo, new):
        calls[j], rows[j] = fill_calls, fill_rows
    node_shared = residency == "disk"  # one file per node: the leader carries every entry, nothing is sent
    if shared and (old == 0 or not (released or node_shared)):  # fill_shared: own chunks looked up, rest gathered
        exp["cache_got"] = own
        rounds = math.ceil(math.ceil(train / (GLOBAL_BATCH // replicas)) / replicas)
        exp["copied"]["all_gather"] = rounds * (replicas - 1) * (GLOBAL_BATCH // replicas) * entry
    if released:  # the evaluation outputs at the new boundary: rank KEEPER computes them, the others receive them
        if rank == KEEPER:
            for j in range(lo, new):
                calls[j] += math.ceil(held_out / EVAL_CHUNK)
                rows[j] += held_out
            if old == 0:
                exp["items_read"] += held_out  # from the inputs: nothing was kept before the first release
        if shared:
            exp["copied"]["broadcast_sent" if rank == KEEPER else "broadcast_received"] = held_out * entry
    exp.update(calls=calls, rows=rows, runners_built=1, bytes_moved=0, released_after=new if released else 0)
    exp["entries"] = train  # every training sample cached at the new boundary
    exp["cache_put_bytes"] = exp["cache_put"] * entry
    exp["cache_carried_bytes"] = exp["cache_carried"] * entry
    return exp


def _counted(rec: dict[str, Any]) -> dict[str, Any]:
    main = rec["work"]["main"]
    keys = ("calls", "rows", "items_read", "cache_put", "cache_put_bytes", "cache_carried", "cache_carried_bytes")
    out = {k: main[k] for k in (*keys, "cache_got", "copied")}
    runners = main["called"].get("runners_built", 0)
    return {
        **out,
        "runners_built": runners,
        "bytes_moved": rec["bytes_moved"],
        "released_after": rec["released_after"],
        "entries": rec["entries"],
    }


def _node(per_rank: list[dict[str, Any]]) -> dict[str, Any]:
    """What a node's ranks did together: rows per sub-layer, items read, entries carried (which rank stores an
    entry in a shared file is a race: the puts are not compared, the entries each rank finds cached are)."""
    rows = [sum(r["rows"][j] for r in per_rank) for j in range(SUBLAYERS)]
    return {"rows": rows, **{k: sum(r[k] for r in per_rank) for k in ("items_read", "cache_carried")}}


def _node_expected(rec: dict[str, Any], sizes: dict[str, int]) -> dict[str, Any]:
    """What a node's ranks may do together over a node-shared tier, which holds every entry once per node: a fill
    reads every training sample once; a carry takes every entry once through the newly frozen sub-layers, in
    place, and reads nothing."""
    old, new, train = rec["old"], rec["new"], sizes["train"]
    rows = [train if old <= j < new else 0 for j in range(SUBLAYERS)]
    fill = old == 0
    return {
        "rows": rows,
        "items_read": train if fill else 0,
        "cache_carried": 0 if fill else train,
    }


def _check(results: list[dict[str, Any]], residency: str, when: str, first: bool) -> None:
    world = len(results)
    for rank, r in enumerate(results):
        assert [(t["old"], t["new"], t["epoch_step"]) for t in r["records"]] == TRANSITIONS[when], rank
    for i in range(len(TRANSITIONS[when])):
        if (i == 0) != first:
            continue
        recs = [r["records"][i] for r in results]
        expected = [_expected(rec, results[0]["sizes"], residency, rank) for rank, rec in enumerate(recs)]
        counted = [_counted(rec) for rec in recs]
        if residency == "disk" and world > 1:
            # one file per node, shared: a put or an in-place carry by one rank serves both (which rank writes an
            # entry is a race); each entry is carried once on the node, nothing recomputed or read again
            assert _node(counted) == _node_expected(recs[0], results[0]["sizes"]), (i, counted)
            same = ("runners_built", "bytes_moved", "released_after", "copied", "entries")
            for c, e in zip(counted, expected, strict=True):
                assert {k: c[k] for k in same} == {k: e[k] for k in same}, (i, c)
            continue
        assert counted == expected, (i, recs[0]["old"], recs[0]["new"])


CASES = [
    (world, residency, when)
    for world in (1, 2)
    for residency in RESIDENCY
    for when in ("epoch_end", "mid_epoch")
    if not (world == 1 and residency == "kept")
]


@pytest.mark.parametrize(("world", "residency", "when"), CASES)
def test_a_transition_over_a_complete_cache_runs_only_the_newly_frozen_sublayers(
    runs: dict[tuple[int, str, str], list[dict[str, Any]]], world: int, residency: str, when: str
) -> None:
    _check(runs[(world, when, residency)], residency, when, first=False)


@pytest.mark.parametrize(("world", "residency", "when"), CASES)
def test_the_first_transition_fills_the_cache_reading_each_sample_once(
    runs: dict[tuple[int, str, str], list[dict[str, Any]]], world: int, residency: str, when: str
) -> None:
    _check(runs[(world, when, residency)], residency, when, first=True)


def test_no_probe_forward_without_a_probe_driven_policy(
    runs: dict[tuple[int, str, str], list[dict[str, Any]]],
) -> None:
    for (world, when, _), results in runs.items():
        if when == "drift":
            continue
        for r in results:
            for rec in r["records"]:
                probe = rec["work"].get("probe")
                assert probe is None or (not any(probe["calls"]) and probe["items_read"] == 0), (world, when, rec)


def test_a_decision_point_that_changes_nothing_does_nothing(
    runs: dict[tuple[int, str, str], list[dict[str, Any]]],
) -> None:
    """FreezeOut's decision points after steps 4 and 8 (epoch ends) freeze nothing: no forward, no read, no write,
    no copy, no runner (the control group's decision message aside)."""
    nothing = {"calls": [0] * SUBLAYERS, "items_read": 0, "cache_put": 0, "cache_carried": 0, "copied": {}}
    for world in (1, 2):
        for residency in RESIDENCY if world == 2 else ("released", "disk"):
            for r in runs[(world, "mid_epoch", residency)]:
                assert [u["epoch_step"] for u in r["unchanged"]] == [0, 0]
                for u in r["unchanged"]:
                    main = u["work"]["main"]
                    assert {k: main[k] for k in nothing} == nothing and not main["called"], (world, residency, u)
                    assert "pause" not in u["work"], u  # the epoch goes on with its batches


def test_a_transition_inside_an_epoch_pauses_it_once_and_the_pause_only_folds_the_losses(
    runs: dict[tuple[int, str, str], list[dict[str, Any]]],
) -> None:
    """The step loop leaves its batches and folds the epoch's losses (one all-reduce) only once a decision is known
    to change the layout, and only inside an epoch (an epoch-end transition has no batches to leave)."""
    for (world, when, residency), results in runs.items():
        for r in results:
            for rec in r["records"]:
                pause = rec["work"].get("pause")
                if rec["epoch_step"] == 0:
                    assert pause is None, (world, when, residency, rec)
                    continue
                assert pause is not None, (world, when, residency, rec)
                assert not any(pause["calls"]) and pause["items_read"] == 0, (world, when, residency, rec)
                assert pause["cache_put"] == pause["cache_carried"] == pause["cache_got"] == 0, rec
                assert set(pause["copied"]) == {"all_reduce"}, (world, when, residency, rec)


def test_the_default_policy_adds_only_its_probe_forwards(
    runs: dict[tuple[int, str, str], list[dict[str, Any]]],
) -> None:
    """``drift``: the transition's own work is the rule's; the probe adds, on the first ``PROBE_SAMPLES`` held-out
    samples, a forward of the sub-layers from the kept boundary (the old one while the prefix is released, whose
    evaluation outputs are kept; the model's input before) to the end of the last watched unit: once for the measure
    at the decision point, once more for the new layout's baseline while a watched unit is still active in it. The
    probe's inputs are read once per layout, not per probe."""
    from elastic_pipe.orchestrator.stage.probe import PROBE_SAMPLES

    (r,) = runs[(1, "drift", "released")]
    _check([r], "released", "drift", first=True)
    _check([r], "released", "drift", first=False)
    probe_rows = min(PROBE_SAMPLES, r["sizes"]["eval"])
    ends, watched = r["units"]["ends"], r["units"]["watched"]
    stop = ends[watched - 1]
    for rec in r["records"]:
        start = rec["released_before"]  # where the probe starts: the kept outputs' boundary (0: the inputs)
        runs_of = 1 + (sum(e <= rec["new"] for e in ends) < watched)  # the measure, and the baseline
        calls = [runs_of if start <= j < stop else 0 for j in range(SUBLAYERS)]
        probe = rec["work"]["probe"]
        assert probe["calls"] == calls, rec
        assert probe["rows"] == [c * probe_rows for c in calls], rec
        # the probe's inputs are read once per layout: the old layout's stage read them at its own baseline, the
        # new one reads them at its baseline (from the inputs while nothing is released)
        assert probe["items_read"] == (probe_rows if start == 0 and runs_of == 2 else 0), rec
        assert probe["cache_put"] == probe["cache_carried"] == probe["cache_got"] == 0 and not probe["copied"], rec
    # the run froze one unit at each decision point, the last one leaving no watched unit active
    assert [sum(e <= t["new"] for e in ends) for t in r["records"]] == [1, 2, watched]


# ------------------------------------------------------------------------------------- a layout that changes too
def _relayout_expected(rec: dict[str, Any], sizes: dict[str, int], released: bool, rank: int) -> dict[str, Any]:
    """2 stages (rank 0 is stage 0) -> 1 stage x 2 replicas: the first transition fills on rank 0 alone; the second
    carries rank 0's entries (it holds them all) through the newly frozen sub-layers once and gives rank 1, the new
    stage-0 rank, the carried entries (and, while the prefix is released, the evaluation outputs), never the inputs
    or the earlier prefix. ``traffic``: the entries' bytes each rank sends or receives (broadcast or all-gather)."""
    from elastic_pipe.orchestrator.prefix.residency import EVAL_CHUNK, KEEPER

    old, new, entry = rec["old"], rec["new"], rec["entry_bytes"]
    train, held_out = sizes["train"], sizes["eval"]
    calls, rows = [0] * SUBLAYERS, [0] * SUBLAYERS
    exp: dict[str, Any] = {"items_read": 0, "cache_put": 0, "cache_carried": 0, "traffic": 0}
    evals = released and rank == KEEPER
    lo = 0 if old == 0 else old
    if rank == 0:  # the fill from the inputs, then the carry of every entry
        work = math.ceil(train / GLOBAL_BATCH) if old == 0 else math.ceil(train / (GLOBAL_BATCH // 2))
        for j in range(lo, new):
            calls[j] = work + (math.ceil(held_out / EVAL_CHUNK) if evals else 0)
            rows[j] = train + (held_out if evals else 0)
        if old == 0:
            exp.update(items_read=train + (held_out if evals else 0), cache_put=train)
        else:
            exp["cache_carried"] = train
    elif old > 0:
        exp["cache_put"] = train
    if old > 0:
        exp["traffic"] = (train + (held_out if released else 0)) * entry
    exp["entries"] = train if rank == 0 or old > 0 else 0  # on every stage-0 rank, every training sample
    return {**exp, "calls": calls, "rows": rows}


def _relayout_counted(rec: dict[str, Any]) -> dict[str, Any]:
    main = rec["work"]["main"]
    copied = main["copied"]
    traffic = sum(copied.get(k, 0) for k in ("broadcast_sent", "broadcast_received", "all_gather"))
    keys = ("calls", "rows", "items_read", "cache_put", "cache_carried")
    return {**{k: main[k] for k in keys}, "traffic": traffic, "entries": rec["entries"]}


@pytest.mark.parametrize(
    "released",
    [True, False],
    ids=["released", "resident"],
)
def test_a_transition_that_also_compresses_the_pipeline_recomputes_nothing(
    runs: dict[tuple[int, str, str], list[dict[str, Any]]], released: bool
) -> None:
    results = runs[(2, "relayout", "released" if released else "kept")]
    for rank, r in enumerate(results):
        assert [(t["old"], t["new"], t["epoch_step"]) for t in r["records"]] == TRANSITIONS["relayout"], rank
        assert [(t["pipe_len"], t["replicas"]) for t in r["records"]] == [(2, 1), (1, 2)], rank
    for i in range(len(TRANSITIONS["relayout"])):
        recs = [r["records"][i] for r in results]
        # the weights and optimizer state the event reports are what the ranks received, and the only
        # point-to-point traffic of the transition
        received = sum(rec["work"]["main"]["copied"].get("recv", 0) for rec in recs)
        sent = sum(rec["work"]["main"]["copied"].get("send", 0) for rec in recs)
        assert recs[0]["bytes_moved"] == received == sent > 0, i
        counted = [_relayout_counted(rec) for rec in recs]
        expected = [_relayout_expected(rec, results[0]["sizes"], released, rank) for rank, rec in enumerate(recs)]
        assert counted == expected, (i, counted)
        assert [rec["work"]["main"]["called"] for rec in recs] == [{"runners_built": 1}] * 2, i
        assert [rec["released_after"] for rec in recs] == [recs[0]["new"] if released else 0] * 2, i
