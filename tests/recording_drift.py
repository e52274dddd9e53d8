"""A :class:`~elastic_pipe.freeze.Drift` that keeps every change vector it observes, for the tests that compare the
drift two runs measure (tests/test_freeze_drift_training.py, tests/test_training_drift_resume.py)."""

from __future__ import annotations

from typing import Any

from elastic_pipe.freeze import Drift

#: Drift's defaults when these tests were written (no relative or settle test, one unit per decision, the last
#: unit never frozen): the tests freeze one unit per decision point on purpose, whatever the defaults are now.
FORMER: dict[str, Any] = {"relative": None, "settle": None, "max_fraction": 0.85, "max_step": 1}


class RecordingDrift(Drift):
    """A Drift that keeps every change vector it observes (rank 0 decides, so only rank 0 sees them); options
    default to :data:`FORMER`."""

    def __init__(self, num_layers: int, **options: Any) -> None:
        super().__init__(num_layers, **{**FORMER, **options})
        self.seen: list[list[float]] = []

    def observe_drift(self, change: Any) -> None:
        self.seen.append([float(c) for c in change])
        super().observe_drift(change)
