"""Hand-written schedules: :class:`ManualSchedule` (epoch -> frozen count) and :class:`Never` (the baseline)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, ClassVar

from elastic_pipe.freeze.errors import CHECK, FreezeError
from elastic_pipe.freeze.policy import check_config, check_current, check_num_layers
from elastic_pipe.freeze.stats import LayerStats

__all__ = ["ManualSchedule", "Never", "parse_manual"]


def parse_manual(text: str) -> dict[int, int]:
    """Parse ``"2:4,5:8"`` (epoch:frozen pairs) into ``{2: 4, 5: 8}``.

    Raises:
        FreezeError: a pair that is not ``int:int``, or an epoch given twice.
    """
    out: dict[int, int] = {}
    for item in filter(None, (part.strip() for part in CHECK.str("manual schedule text", text).split(","))):
        epoch_text, sep, frozen_text = item.partition(":")
        try:
            if not sep:
                raise ValueError(item)
            epoch, frozen = int(epoch_text), int(frozen_text)
        except ValueError:
            raise FreezeError(f"manual schedule entry {item!r} is not EPOCH:FROZEN (e.g. '2:4,5:8')") from None
        if epoch in out:
            raise FreezeError(f"manual schedule gives epoch {epoch} twice")
        out[epoch] = frozen
    return out


class ManualSchedule:
    """Schedule-driven policy: from each listed epoch on, freeze the listed number of leading layers.

    Before the first listed epoch nothing is frozen; between entries the last one holds.

    Args:
        num_layers: freezable layers L.
        schedule: epoch -> frozen count; counts in ``[0, L]`` and non-decreasing with the epoch. An epoch may be
            written as a string of decimal digits (``{"1": 2}``), as TOML and JSON tables write their keys.
    """

    name: ClassVar[str] = "manual"
    needs_stats: ClassVar[bool] = False

    def __init__(self, num_layers: int, schedule: Mapping[int, int] | Mapping[str, int]) -> None:
        check_num_layers("ManualSchedule", num_layers)
        CHECK.mapping("ManualSchedule: schedule", schedule)
        items = sorted(
            (
                CHECK.int("ManualSchedule: schedule epoch", int(e) if isinstance(e, str) and e.isdecimal() else e),
                CHECK.int("ManualSchedule: schedule frozen count", f),
            )
            for e, f in schedule.items()
        )
        previous = 0
        for epoch, frozen in items:
            if epoch < 0 or not 0 <= frozen <= num_layers:
                raise FreezeError(
                    f"ManualSchedule: entry {epoch}: {frozen} needs epoch >= 0 and frozen in [0, {num_layers}]"
                )
            if frozen < previous:
                raise FreezeError(
                    f"ManualSchedule: epoch {epoch} lowers the frozen count to {frozen} from {previous}; "
                    "expected a non-decreasing schedule (policies never unfreeze)"
                )
            previous = frozen
        self.num_layers = num_layers
        self.schedule: dict[int, int] = dict(items)

    def __repr__(self) -> str:
        return f"ManualSchedule(num_layers={self.num_layers}, schedule={self.schedule})"

    def frozen_at(self, epoch: int) -> int:
        """The count of the latest entry at or before ``epoch`` (0 before the first)."""
        return max((f for e, f in self.schedule.items() if e <= epoch), default=0)

    def observe(self, stats: LayerStats) -> None:
        """Ignored: the schedule depends on the epoch only."""

    def observe_eval(self, loss: float) -> None:
        """Ignored: the schedule depends on the epoch only."""

    def propose(self, epoch: int, step: int, current: int) -> int:
        """``max(current, frozen_at(epoch))``."""
        check_current("ManualSchedule", self.num_layers, current)
        return max(current, self.frozen_at(epoch))

    def _config(self) -> dict[str, Any]:
        # JSON object keys are strings; store pairs so that a JSON round trip compares equal
        return {
            "policy": self.name,
            "num_layers": self.num_layers,
            "schedule": [[e, f] for e, f in self.schedule.items()],
        }

    def state_dict(self) -> dict[str, Any]:
        """Configuration only: the schedule has no mutable state."""
        return self._config()

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Check that the snapshot belongs to the same schedule."""
        check_config("ManualSchedule", state, self._config())


class Never:
    """Baseline policy: never freezes anything (keeps whatever is frozen already).

    Args:
        num_layers: freezable layers L.
    """

    name: ClassVar[str] = "never"
    needs_stats: ClassVar[bool] = False

    def __init__(self, num_layers: int) -> None:
        check_num_layers("Never", num_layers)
        self.num_layers = num_layers

    def __repr__(self) -> str:
        return f"Never(num_layers={self.num_layers})"

    def observe(self, stats: LayerStats) -> None:
        """Ignored."""

    def observe_eval(self, loss: float) -> None:
        """Ignored: nothing is ever frozen."""

    def propose(self, epoch: int, step: int, current: int) -> int:
        """``current``: nothing new is frozen."""
        check_current("Never", self.num_layers, current)
        return current

    def state_dict(self) -> dict[str, Any]:
        """Configuration only."""
        return {"policy": self.name, "num_layers": self.num_layers}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Check that the snapshot belongs to a :class:`Never` of the same size."""
        check_config("Never", state, self.state_dict())
