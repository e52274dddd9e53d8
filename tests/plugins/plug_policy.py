"""A freeze policy that lives outside elastic_pipe, for the tests that plug user code in by object and by path."""

from __future__ import annotations

from typing import Any, ClassVar

from elastic_pipe.freeze import LayerStats


class OneUnitPerEpoch:
    """Freezes one more leading unit at every decision point, up to ``limit``; counts what it was told."""

    name: ClassVar[str] = "one-unit-per-epoch"
    needs_stats: ClassVar[bool] = False

    def __init__(self, num_layers: int, limit: int = 2) -> None:
        self.num_layers = num_layers
        self.limit = limit
        self.evals: list[float] = []

    def observe(self, stats: LayerStats) -> None:
        del stats

    def observe_eval(self, loss: float) -> None:
        self.evals.append(loss)

    def propose(self, epoch: int, step: int, current: int) -> int:
        del step, current
        return min(epoch, self.limit, self.num_layers)

    def state_dict(self) -> dict[str, Any]:
        return {"limit": self.limit, "evals": list(self.evals)}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.limit, self.evals = int(state["limit"]), list(state["evals"])


class TwoMembers:
    """A policy with only what it uses: ``num_layers`` and ``propose`` (one more unit per epoch, up to 2)."""

    def __init__(self, num_layers: int) -> None:
        self.num_layers = num_layers

    def propose(self, epoch: int, step: int, current: int) -> int:
        del step, current
        return min(epoch, 2, self.num_layers)


def one_unit_per_epoch(epoch: int, step: int, current: int) -> int:
    """A plain function policy: one more unit per epoch, up to 2."""
    del step
    return max(current, min(epoch, 2))


class EarlierProtocol:
    """A policy written against the protocol before ``observe_eval``: every other member, freezing one unit per
    epoch up to 2."""

    name = "earlier"
    needs_stats = False

    def __init__(self, num_layers: int) -> None:
        self.num_layers = num_layers
        self.asked = 0

    def observe(self, stats: LayerStats) -> None:
        del stats

    def propose(self, epoch: int, step: int, current: int) -> int:
        del step, current
        self.asked += 1
        return min(epoch, 2, self.num_layers)

    def state_dict(self) -> dict[str, Any]:
        return {"asked": self.asked}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.asked = int(state["asked"])


def twelve_units(num_layers: int) -> TwoMembers:
    """A factory that ignores the model and claims 12 units (a 6-block model's policy written for 12 layers)."""
    del num_layers
    return TwoMembers(12)


class OneUnitFromStep3:
    """Freezes the first unit at the first decision point from step 3 on: inside the first epoch."""

    name: ClassVar[str] = "one-unit-from-step-3"
    needs_stats: ClassVar[bool] = False

    def __init__(self, num_layers: int) -> None:
        self.num_layers = num_layers

    def propose(self, epoch: int, step: int, current: int) -> int:
        del epoch
        return max(current, 1) if step >= 3 else current
