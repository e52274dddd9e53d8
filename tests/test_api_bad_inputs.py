"""Bad arguments to the library API, table-driven: every public callable of the primitives and the planner.

The table is built by introspection: each callable in a package's ``__all__`` (classes included: their constructor
is the call) has its parameters read from its signature, and each parameter whose annotation says what it holds
(an int, a float, a string, a sequence of numbers, an object of some type) is tried, one at a time, with the bad
values of each category below while every other argument keeps a valid value (its default, a value in
:data:`BASELINES`, or one derived from its annotation). Every such call must raise an
:class:`~elastic_pipe.types.ElasticPipeError` whose message names the parameter (for a wrong type, one that is also
a ``TypeError``, so code that caught the builtin error keeps working), within :data:`HANG_SECONDS` -
not a raw ``TypeError``/``AttributeError``/``ValueError``, not a silent return, not a hang. A new public callable
is covered as soon as it is exported. A required argument with no valid value (no baseline, an annotation no value
derives from) gets :data:`WRONG` and is tried itself; the parameters after it are not (the coverage test prints how
many), so a baseline in :data:`BASELINES` widens the table.

Exempt (listed, with the reason): exceptions, enums, protocols and type aliases (nothing to call), and the
records a package builds for its caller (:data:`RECORDS`).
"""

from __future__ import annotations

import dataclasses
import enum
import importlib
import inspect
import math
import threading
from collections import Counter
from collections.abc import Callable
from typing import Any

import pytest
import torch

from elastic_pipe import cache, freeze, models, partition, planner, protocol, schedule
from elastic_pipe.types import ElasticPipeError, LayerCost

PACKAGES = ("freeze", "partition", "schedule", "groups", "protocol", "cache", "data", "models", "planner")
#: A call that has not returned after this long counts as a hang (every call here is refused at entry, at once).
HANG_SECONDS = 5.0


class _Wrong:
    """An object of no type any parameter accepts."""

    def __repr__(self) -> str:
        return "<wrong>"


WRONG = _Wrong()

#: Bad values per category, per kind of parameter (a kind absent from a category is not tried in it).
BAD: dict[str, dict[str, list[object]]] = {
    "wrong type": {
        "int": ["3", 2.5],
        "float": ["1.0"],
        "str": [3],
        "ints": [3, "12"],
        "floats": [3, "12"],
        "object": [WRONG],
    },
    "negative size": {"int": [-1], "float": [-1.0], "ints": [[-1]], "floats": [[-1.0]]},
    "huge size": {"int": [10**30], "ints": [[10**30]]},
    "NaN/inf": {"float": [math.nan, math.inf], "floats": [[math.nan], [math.inf]]},
    "empty sequence": {"ints": [[]], "floats": [[]]},
    "bad element": {"ints": [["x"]], "floats": [["x"]]},
}
CATEGORIES = tuple(BAD)

#: Annotation (as written in the source) -> kind; ``| None`` is stripped first (None stays allowed, so is not tried).
KINDS = {
    "int": "int",
    "float": "float",
    "str": "str",
    "Sequence[float]": "floats",
    "tuple[float, ...]": "floats",
    "Sequence[int]": "ints",
    "tuple[int, ...]": "ints",
    "Iterable[int]": "ints",
}
#: Annotations that accept anything (nothing is wrong for them) or flags (any value has a truth value).
UNTYPED = {"Any", "object", "bool", ""}

#: Records a package builds and hands to its caller (results, statistics, plans); users read them, never build
#: them from their own input, and checking their fields would cost time on every lookup or step.
RECORDS = {
    "partition.Partition",
    "partition.Compression",
    "partition.PricedSolver",
    "schedule.Simulation",
    "schedule.MicrobatchChoice",
    "schedule.TuningRow",
    "cache.CacheDecision",
    "cache.CacheLookup",
    "cache.CacheStats",
    "cache.PendingLookup",
    "cache.TierStats",
    "planner.EpochPlan",
    "planner.Plan",
    "planner.StepBreakdown",
    "planner.StepPrediction",
    "models.SubLayerProfile",
}

#: A small valid transformer shape.
SHAPE = {
    "name": "t",
    "family": "gpt",
    "blocks": 1,
    "hidden": 4,
    "heads": 1,
    "ffn": 4,
    "seq_len": 4,
    "vocab": 8,
    "positions": 8,
}


def transition() -> Any:
    """A valid transition message."""
    return protocol.TransitionMessage(0, 0, 0, 1, (0, 1), 1, 1.0, ())


def sublayer() -> Any:
    """A valid planner sub-layer cost."""
    return planner.SubLayerCost("a", 0, 1, 1.0, 1.0, 1.0, 1.0, 1.0)


#: Valid values of required arguments that cannot be derived from their annotation (built on demand: some are
#: models or tensors).
BASELINES: dict[str, Callable[[], dict[str, Any]]] = {
    "freeze.Drift": lambda: {"total_steps": 100},
    "freeze.make_policy": lambda: {"name": "never"},
    "freeze.register_policy": lambda: {"factory": freeze.Never},
    "freeze.FunctionPolicy": lambda: {"function": lambda epoch, step, current: current},
    "freeze.frozen_by_epoch": lambda: {"given": freeze.Never(2)},
    "freeze.decide": lambda: {"policy": freeze.Never(2)},
    "freeze.ManualSchedule": lambda: {"schedule": {1: 1}},
    "partition.TransformerShape": lambda: SHAPE,
    "planner.TransformerShape": lambda: SHAPE,
    "planner.ModelConfig": lambda: SHAPE,
    "partition.alive_bytes": lambda: {"graph": partition.chain_graph([1.0]), "order": [0]},
    "partition.graph_order": lambda: {"graph": partition.chain_graph([1.0])},
    "partition.graph_partition": lambda: {"graph": partition.chain_graph([1.0])},
    "partition.graph_stage_costs": lambda: {"graph": partition.chain_graph([1.0])},
    "partition.profile_layers": lambda: {"layers": [("a", torch.nn.Linear(2, 2))], "example_input": torch.zeros(1, 2)},
    "partition.register_solver": lambda: {"name": "bad-input-test", "solver": partition.uniform},
    "partition.prices_frozen_itself": lambda: {"solver": partition.uniform},
    "partition.training_memory_bytes": lambda: {"precision": partition.TrainingPrecision()},
    "partition.transformer_costs": lambda: {"shape": partition.TransformerShape(**SHAPE)},
    "partition.transformer_graph": lambda: {"costs": [LayerCost("a", forward=1.0)], "residual": [False]},
    "partition.weights_from_costs": lambda: {"costs": [LayerCost("a", forward=1.0)]},
    "schedule.Action": lambda: {"kind": schedule.ActionKind.F},
    "schedule.Schedule": lambda: {
        "kind": "1f1b",
        "actions": {0: (schedule.Action(0, "F", 0), schedule.Action(0, "B", 0))},
    },
    "schedule.generate": lambda: {"kind": "gpipe"},
    "schedule.refusal": lambda: {"kind": "gpipe"},
    "schedule.accepts": lambda: {"kind": "gpipe"},
    "schedule.interleaved_1f1b": lambda: {"ranks": 1, "microbatches": 1, "chunks": 2},
    "schedule.check_structure": lambda: {"schedule": schedule.generate("1f1b", 1, 1)},
    "schedule.validate": lambda: {"schedule": schedule.generate("1f1b", 1, 1)},
    "schedule.peak_activations": lambda: {"schedule": schedule.generate("1f1b", 1, 1)},
    "schedule.torch_actions": lambda: {"schedule": schedule.generate("1f1b", 1, 1)},
    "schedule.simulate": lambda: {"schedule": schedule.generate("1f1b", 1, 1), "forward": 1.0, "backward": 1.0},
    "schedule.tune_microbatches": lambda: {"cost": schedule.LinearCost((1.0,), (1.0,), (0.0,))},
    "groups.GroupManager": lambda: {"world_size": 1, "rank": 0, "pipe_lens": [1], "backend": "gloo"},
    "protocol.TransitionMessage": lambda: {
        "epoch": 0,
        "step": 0,
        "frozen": 0,
        "pipe_len": 1,
        "boundaries": (0, 1),
        "microbatches": 1,
        "max_cost_at_start": 1.0,
        "changed_ranks": (),
    },
    "protocol.StateEntry": lambda: {"kind": "int", "value": 1},
    "protocol.OptimizerStateHeader": lambda: {"params": ()},
    "protocol.describe": lambda: {"msg": transition()},
    "protocol.message_to_dict": lambda: {"msg": transition()},
    "protocol.encode": lambda: {"msg": transition()},
    "protocol.decode": lambda: {"data": protocol.encode(transition())},
    "protocol.decode_any": lambda: {"data": protocol.encode(transition())},
    "protocol.describe_legacy": lambda: {"msg": protocol.LegacyMessage(0, 1, 1.0, 0)},
    "protocol.legacy_to_dict": lambda: {"msg": protocol.LegacyMessage(0, 1, 1.0, 0)},
    "protocol.encode_legacy": lambda: {"msg": protocol.LegacyMessage(0, 1, 1.0, 0)},
    "protocol.decode_legacy": lambda: {"values": protocol.encode_legacy(protocol.LegacyMessage(0, 1, 1.0, 0))},
    "cache.expected_read_seconds": lambda: {"spread": {"device": 1, "none": 0}, "tier_seconds": {"device": 1.0}},
    "cache.payoff_threshold": lambda: {"read_seconds": 1.0, "recompute_seconds": [2.0]},
    "cache.prefix_fingerprint": lambda: {"tensors": [torch.zeros(1)]},
    "cache.stored_dtype": lambda: {"given": torch.float32, "storage": None},
    "cache.time_call": lambda: {"fn": lambda: None},
    "cache.measure_payoff": lambda: {
        "cache": cache.ActivationCache(4, device_budget=1 << 20),
        "sample_ids": torch.arange(2),
        "inputs": torch.zeros(2, 3),
        "prefix": torch.nn.Identity(),
    },
    "cache.measure_tiered_payoff": lambda: {
        "cache": cache.ActivationCache(4, device_budget=1 << 20),
        "inputs": torch.zeros(2, 3),
        "prefix": torch.nn.Identity(),
        "samples": 4,
    },
    "cache.parse_storage_dtype": lambda: {"name": "auto"},
    "data.ElasticSampler": lambda: {"num_samples": 4, "num_replicas": 1, "rank": 0},
    "data.IndexedDataset": lambda: {
        "inputs": torch.zeros(1, 1, 2, 2),
        "labels": torch.zeros(1, dtype=torch.int64),
        "sample_ids": torch.zeros(1, dtype=torch.int64),
    },
    "data.TextCorpus": lambda: {"texts": ("a",), "labels": (0,), "classes": ("c",)},
    "models.LlamaConfig": lambda: {"dim": 2},
    "models.MissingInit": lambda: {"missing": ["a"]},
    "models.CheckpointInit": lambda: {"open_reader": lambda: None, "weight_map": {}},
    "models.MappingReader": lambda: {"tensors": {}},
    "models.SubLayerModel": lambda: {"layers": [("a", torch.nn.Identity())], "unit_ends": [1]},
    "models.analyze": lambda: {"model": [("a", torch.nn.Identity())], "example": torch.zeros(1, 2)},
    "models.sublayer_costs": lambda: {"model": [("a", torch.nn.Identity())], "example": torch.zeros(1, 2)},
    "models.next_token_loss": lambda: {"logits": torch.zeros(1, 2, 3), "tokens": torch.zeros(1, 2, dtype=torch.int64)},
    "models.vit": lambda: {"meta": True},
    "models.bert_encoder": lambda: {"meta": True},
    "models.gpt_decoder": lambda: {"meta": True},
    "models.llama_decoder": lambda: {"meta": True},
    "freeze.as_policy": lambda: {"obj": lambda epoch, step, current: current},
    "freeze.freeze_modules": lambda: {"modules": [torch.nn.Linear(1, 1)]},
    "schedule.gantt": lambda: {
        "simulation": schedule.simulate(schedule.generate("1f1b", 1, 1), 1.0, 1.0),
        "path": "/nonexistent/gantt.png",
    },
    "models.minilm_tokenize": lambda: {"sentences": ["a"]},
    "models.llama_weight_map": lambda: {"config": models.llama_config("llama-tiny")},
    "schedule.torch_schedule": lambda: {
        "schedule": schedule.generate("1f1b", 1, 1),
        "rank": 0,
        "stages": [],
        "loss_fn": lambda output, target: output,
    },
    "models.release": lambda: {"model": models.vit(meta=True)},
    "models.materialize": lambda: {"model": models.vit(meta=True)},
    "models.materialize_sublayers": lambda: {"model": models.vit(meta=True)},
    "models.hold_only": lambda: {"model": models.vit(meta=True), "path": "/nonexistent", "weight_map": {}},
    "models.materialize_from_safetensors": lambda: {
        "model": models.vit(meta=True),
        "path": "/nonexistent",
        "weight_map": {},
    },
    "models.load_sublayers": lambda: {
        "model": models.vit(meta=True),
        "reader": models.MappingReader({}),
        "weight_map": {},
    },
    "planner.from_layer_costs": lambda: {"costs": [LayerCost("a", forward=1.0)]},
    "planner.to_layer_costs": lambda: {"costs": [sublayer()]},
    "planner.price": lambda: {"work": [planner.SubLayerWork("a", 0, 1, 1.0)]},
    "planner.predict_step": lambda: {"entries": [(sublayer(), planner.Mode.ACTIVE)], "cluster": planner.ClusterSpec(1)},
    "planner.make_plan": lambda: {
        "costs": [sublayer()],
        "cluster": planner.ClusterSpec(1),
        "job": planner.JobSpec(1, 1, 1),
    },
    "planner.plan_model": lambda: {
        "name": "bert-base",
        "cluster": planner.ClusterSpec(1),
        "job": planner.JobSpec(1, 1, 1),
    },
}

#: Bad-looking values a parameter accepts on purpose: (callable, parameter) -> the values' reprs and why.
VALID: dict[tuple[str, str], tuple[tuple[str, ...], str]] = {
    ("freeze.relative_change", "diff_sq"): (("[inf]",), "an infinite distance is a layer that changed beyond measure"),
    ("freeze.relative_change", "ref_sq"): (("[inf]",), "an infinite reference norm reads as no change"),
    ("partition.compress_memory", "budget"): (("inf",), "an infinite budget is no memory limit"),
    ("partition.compress_halving", "budget"): (("inf",), "an infinite budget is no memory limit"),
    ("partition.graph_partition", "bandwidth"): (("inf",), "an infinite bandwidth makes transfers free"),
    ("partition.graph_stage_costs", "bandwidth"): (("inf",), "an infinite bandwidth makes transfers free"),
    ("schedule.Schedule", "placement"): (("[]",), "no placement is the looped one"),
    ("groups.GroupManager", "timeout"): (("inf",), "an infinite timeout waits for ever, as asked"),
    ("cache.decide", "read_seconds"): (("inf",), "an infinite read time is no cache to read from"),
    **{
        (f"models.{name}", "indices"): (("[]",), "no sub-layers: nothing to move")
        for name in ("release", "materialize", "materialize_sublayers", "hold_only", "materialize_from_safetensors")
    },
    ("models.load_sublayers", "indices"): (("[]",), "no sub-layers: nothing to read"),
    ("freeze.needs_probe", "policy"): (
        ("<wrong>",),
        "any object: one without needs_probe and observe_drift reads none",
    ),
}


def _exempt(qualname: str, obj: object) -> str | None:
    """Why ``obj`` is not in the table, or None when it is."""
    if inspect.isclass(obj) and issubclass(obj, BaseException):
        return "exception"
    if inspect.isclass(obj) and issubclass(obj, enum.Enum):
        return "enum"
    if getattr(obj, "_is_protocol", False):
        return "protocol"
    if not (inspect.isclass(obj) or inspect.isfunction(obj)):
        return "type alias"
    if qualname in RECORDS:
        return "record"
    return None


def _public(package: str) -> list[tuple[str, Any]]:
    module = importlib.import_module(f"elastic_pipe.{package}")
    return [(f"{package}.{name}", getattr(module, name)) for name in module.__all__ if callable(getattr(module, name))]


def _kind(annotation: object) -> str | None:
    """The kind of a parameter's annotation, ``"object"`` for any other typed one, None for an untyped one."""
    text = annotation if isinstance(annotation, str) else getattr(annotation, "__name__", "")
    parts = [p.strip() for p in str(text).split("|") if p.strip() != "None"]
    text = " | ".join(parts)
    if text in UNTYPED or annotation is inspect.Parameter.empty:
        return None
    return KINDS.get(text, "object")


#: A valid value per kind, for required arguments without a baseline.
DERIVED = {"int": 1, "float": 1.0, "str": "x", "ints": [1], "floats": [1.0]}


def _parameters(obj: Any) -> list[inspect.Parameter]:
    return [
        p
        for p in inspect.signature(obj).parameters.values()
        if p.kind not in (inspect.Parameter.VAR_POSITIONAL, inspect.Parameter.VAR_KEYWORD)
    ]


def _baseline(qualname: str, params: list[inspect.Parameter]) -> tuple[dict[str, Any], int]:
    """Valid keyword arguments for every required parameter, and how many parameters (in order) can be tried.

    A required parameter with no valid value (no baseline, an annotation no value derives from) gets :data:`WRONG`:
    checks run in parameter order, so it is tried itself, but the parameters after it are not (counted as untried).
    """
    given = BASELINES[qualname]() if qualname in BASELINES else {}
    out: dict[str, Any] = {}
    tried = len(params)
    for index, p in enumerate(params):
        if p.name in given:
            out[p.name] = given[p.name]
        elif p.default is inspect.Parameter.empty:
            kind = _kind(p.annotation)
            if kind in DERIVED:
                out[p.name] = DERIVED[kind]
            else:
                out[p.name] = WRONG
                tried = min(tried, index + 1)
    return out, tried


def _default_is(p: inspect.Parameter, value: object) -> bool:
    """Whether ``value`` is the parameter's own default (then it is valid, not bad)."""
    if p.default is inspect.Parameter.empty:
        return False
    try:
        return bool(p.default == value) or (
            isinstance(value, float) and isinstance(p.default, float) and math.isnan(value) and math.isnan(p.default)
        )
    except Exception:
        return False


def _valid(qualname: str, param: str, value: object) -> bool:
    """Whether ``value`` is in :data:`VALID` for the parameter."""
    return repr(value) in VALID.get((qualname, param), ((), ""))[0]


@dataclasses.dataclass
class Case:
    """One bad call: ``target(**kwargs)`` with ``param`` set to a bad value of ``category``."""

    qualname: str
    target: Any
    param: str
    category: str
    value: object
    kwargs: dict[str, Any]

    def __str__(self) -> str:
        return f"{self.qualname}({self.param}={self.value!r}) [{self.category}]"

    def call(self) -> object:
        """Make the call (positional-only parameters passed by position)."""
        params = _parameters(self.target)
        positional = [p.name for p in params if p.kind is inspect.Parameter.POSITIONAL_ONLY]
        args = [self.kwargs[name] for name in positional]
        return self.target(*args, **{k: v for k, v in self.kwargs.items() if k not in positional})


def cases(package: str) -> list[Case]:
    """Every bad call for the package's public callables."""
    out: list[Case] = []
    for qualname, obj in _public(package):
        if _exempt(qualname, obj):
            continue
        params = _parameters(obj)
        base, tried = _baseline(qualname, params)
        for p in params[:tried]:
            kind = _kind(p.annotation)
            if kind is None:
                continue
            for category in CATEGORIES:
                for value in BAD[category].get(kind, []):
                    if not _default_is(p, value) and not _valid(qualname, p.name, value):
                        out.append(Case(qualname, obj, p.name, category, value, {**base, p.name: value}))
    return out


def outcome(case: Case, timeout: float = HANG_SECONDS) -> str:
    """``"handled"`` (an ElasticPipeError naming the parameter) or what went wrong instead."""
    result: list[object] = []

    def call() -> None:
        try:
            case.call()
            result.append(None)
        except BaseException as exc:
            result.append(exc)

    worker = threading.Thread(target=call, daemon=True)
    worker.start()
    worker.join(timeout)
    if not result:
        return "hang"
    exc = result[0]
    if exc is None:
        return "silently accepted"
    if not isinstance(exc, ElasticPipeError):
        return f"raw {type(exc).__name__}: {str(exc)[:120]}"
    if case.param not in str(exc):
        return f"{type(exc).__name__} not naming {case.param!r}: {str(exc)[:120]}"
    if case.category == "wrong type" and not isinstance(exc, TypeError):
        return f"{type(exc).__name__} for a wrong type is no TypeError: {str(exc)[:120]}"
    return "handled"


def tally(package: str) -> tuple[Counter[str], Counter[str], list[str]]:
    """Tried and handled calls per category, and a line per call that was not handled."""
    tried: Counter[str] = Counter()
    handled: Counter[str] = Counter()
    failures = []
    torch.manual_seed(0)
    for case in cases(package):
        tried[case.category] += 1
        result = outcome(case)
        if result == "handled":
            handled[case.category] += 1
        else:
            failures.append(f"{case}: {result}")
    return tried, handled, failures


@pytest.mark.parametrize("package", PACKAGES)
def test_every_bad_argument_raises_a_named_error(package: str) -> None:
    tried, handled, failures = tally(package)
    table = ", ".join(f"{c} {handled[c]}/{tried[c]}" for c in CATEGORIES if tried[c])
    print(f"{package}: {table}")  # the tried/handled table the closing note quotes (pytest -s)
    assert sum(tried.values()) > 0
    assert not failures, f"{len(failures)} bad calls not handled ({table}):\n" + "\n".join(failures)


def test_the_table_covers_every_public_callable() -> None:
    exempt: Counter[str] = Counter()
    covered = 0
    untried: list[str] = []
    for package in PACKAGES:
        for qualname, obj in _public(package):
            reason = _exempt(qualname, obj)
            if reason:
                exempt[reason] += 1
                continue
            params = _parameters(obj)
            untried.extend(f"{qualname}.{p.name}" for p in params[_baseline(qualname, params)[1] :])
            covered += 1
    assert covered > 150
    assert set(exempt) <= {"exception", "enum", "protocol", "type alias", "record"}
    assert exempt["record"] == len(RECORDS)
    print(f"{covered} callables in the table, exempt {dict(exempt)}; parameters not tried: {len(untried)}")


def test_the_harness_tells_a_raw_error_a_silent_accept_and_a_hang_apart() -> None:
    def raw(n: int) -> None:
        raise TypeError(n)

    def silent(n: int) -> None:
        return None

    def hangs(n: int) -> None:
        threading.Event().wait(1.0)

    class NamedTypeError(ElasticPipeError, TypeError):
        pass

    def named(n: int) -> None:
        raise NamedTypeError(f"n must be an int, got {n!r}")

    def untyped(n: int) -> None:
        raise ElasticPipeError(f"n must be an int, got {n!r}")

    def unnamed(n: int) -> None:
        raise ElasticPipeError("bad")

    results = {
        f.__name__: outcome(Case(f.__name__, f, "n", "wrong type", "3", {"n": "3"}))
        for f in (raw, silent, named, unnamed, untyped)
    }
    assert results["raw"].startswith("raw TypeError")
    assert results["silent"] == "silently accepted"
    assert results["named"] == "handled"
    assert "not naming 'n'" in results["unnamed"]
    assert "is no TypeError" in results["untyped"]
    assert outcome(Case("hangs", hangs, "n", "huge size", 10**30, {"n": 10**30}), timeout=0.1) == "hang"
    assert [c.param for c in cases("groups") if c.qualname == "groups.silent_ranks"] == ["message"]
