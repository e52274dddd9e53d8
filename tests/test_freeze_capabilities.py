"""Optional capabilities of a freeze policy are protocols: a probe-reading policy is any object with ``needs_probe``
and ``observe_drift`` (:class:`elastic_pipe.freeze.ProbePolicy`), a capped one has ``signal_layers``
(:class:`~elastic_pipe.freeze.SignalCap`), one with its own rhythm ``decisions_per_epoch``
(:class:`~elastic_pipe.freeze.DecisionRhythm`); no base class and no attribute lookups. A policy without them gets
the defaults."""

from __future__ import annotations

import inspect
from collections.abc import Sequence

from elastic_pipe import freeze
from elastic_pipe.freeze import ProbePolicy
from elastic_pipe.orchestrator.components import decision_interval
from elastic_pipe.orchestrator.demo import DIGITS_SAMPLES, demo_config, steps_per_epoch


class _Custom:
    """A user's probe-driven policy written from scratch: freezes one unit once the first unit's drift is small."""

    name = "custom"
    needs_stats = False
    needs_probe = True

    def __init__(self, num_layers: int) -> None:
        self.num_layers = num_layers
        self.seen: list[tuple[float, ...]] = []

    def observe_drift(self, change: Sequence[float]) -> None:
        self.seen.append(tuple(change))

    def propose(self, epoch: int, step: int, current: int) -> int:
        return max(current, int(bool(self.seen) and self.seen[-1][0] < 0.1))


def test_the_probe_capability_is_a_protocol_the_runtime_checks() -> None:
    drift = freeze.make_policy("drift", 4, total_steps=10)
    assert isinstance(drift, ProbePolicy) and freeze.needs_probe(drift)
    assert not isinstance(freeze.make_policy("alpha", 4, alpha=0.5), ProbePolicy)
    custom = _Custom(3)
    assert isinstance(custom, ProbePolicy) and freeze.needs_probe(custom)
    custom.observe_drift((0.05, 0.2, 0.3))
    assert custom.propose(1, 10, 0) == 1


def test_an_object_without_observe_drift_is_no_probe_policy() -> None:
    class HalfDone:
        needs_probe = True

    assert not isinstance(HalfDone(), ProbePolicy) and not freeze.needs_probe(HalfDone())  # type: ignore[arg-type]


def test_decisions_per_epoch_reads_the_optional_rhythm_and_defaults_to_one() -> None:
    class Rhythm:
        def __init__(self, n: object) -> None:
            self.decisions_per_epoch = n

    assert freeze.decisions_per_epoch(freeze.make_policy("drift", 4, total_steps=100)) == 4  # its measured rhythm
    assert freeze.decisions_per_epoch(Rhythm(3)) == 3
    assert freeze.decisions_per_epoch(object()) == 1  # no attribute: after every epoch
    for bad in (True, 0, -2, 2.5, "4", None):
        assert freeze.decisions_per_epoch(Rhythm(bad)) == 1, bad


class _Plain:
    """A custom policy with only the required members: none of the optional capabilities."""

    def __init__(self, num_layers: int) -> None:
        self.num_layers = num_layers

    def propose(self, epoch: int, step: int, current: int) -> int:
        return min(current + 1, self.num_layers)


class _Capable(_Plain):
    """The same policy with every optional capability: a cap, a rhythm and the probe."""

    signal_layers = 2
    decisions_per_epoch = 4
    needs_probe = True

    def __init__(self, num_layers: int) -> None:
        super().__init__(num_layers)
        self.drifts: list[tuple[float, ...]] = []

    def observe_drift(self, change: Sequence[float]) -> None:
        self.drifts.append(tuple(change))


def test_a_policy_without_the_optional_capabilities_gets_the_defaults_and_still_decides() -> None:
    policy = freeze.as_policy(_Plain(5))
    for capability in (freeze.SignalCap, freeze.DecisionRhythm, ProbePolicy):
        assert not isinstance(_Plain(5), capability)
    assert freeze.signal_layers(policy) == 5  # every layer watched
    assert freeze.decisions_per_epoch(policy) == 1  # after every epoch
    assert not freeze.needs_probe(policy)  # no probe run
    assert freeze.decide(policy, epoch=1, step=10, current=2) == 3


def test_a_policy_with_the_optional_capabilities_is_read_through_the_protocols() -> None:
    capable = _Capable(5)
    for capability in (freeze.SignalCap, freeze.DecisionRhythm, ProbePolicy):
        assert isinstance(capable, capability)
    assert (freeze.signal_layers(capable), freeze.decisions_per_epoch(capable)) == (2, 4)  # type: ignore[arg-type]
    assert freeze.needs_probe(capable)  # type: ignore[arg-type]
    completed = freeze.as_policy(capable)  # lacks name, observe, ...: completed with the defaults
    assert completed is not capable
    assert (freeze.signal_layers(completed), freeze.decisions_per_epoch(completed)) == (2, 4)
    assert freeze.needs_probe(completed) and isinstance(completed, ProbePolicy)
    completed.observe_drift((0.5, 0.25))
    assert capable.drifts == [(0.5, 0.25)]
    # what the completion answers is its own member, not a __getattr__ forward, so that a protocol check that does
    # not call __getattr__ (Python 3.12's) sees it too
    for member in ("signal_layers", "decisions_per_epoch", "needs_probe", "observe_drift"):
        inspect.getattr_static(completed, member)


def test_a_completed_policy_without_the_capabilities_answers_with_the_defaults() -> None:
    completed = freeze.as_policy(_Plain(5))
    assert freeze.signal_layers(completed) == 5
    assert freeze.decisions_per_epoch(completed) == 1 and not freeze.needs_probe(completed)


def test_the_trainer_decides_at_the_rhythm_a_policy_declares_and_after_every_epoch_without_one() -> None:
    config = demo_config()
    steps = steps_per_epoch(config)
    assert decision_interval(config, freeze.as_policy(_Plain(4)), DIGITS_SAMPLES) == 0  # after every epoch
    assert decision_interval(config, freeze.as_policy(_Capable(4)), DIGITS_SAMPLES) == steps // 4
