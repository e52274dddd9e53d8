"""Optional capabilities of a freeze policy are protocols: a probe-reading policy is any object with ``needs_probe``
and ``observe_drift`` (:class:`elastic_pipe.freeze.probe.ProbePolicy`), no base class and no attribute lookups."""

from __future__ import annotations

from collections.abc import Sequence

from elastic_pipe import freeze
from elastic_pipe.freeze.probe import ProbePolicy


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
