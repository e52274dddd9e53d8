"""The orchestrator's exception family."""

from __future__ import annotations

from elastic_pipe.types import ElasticPipeError

__all__ = ["ConfigError", "NonFiniteLossError", "OrchestratorError", "WorkerFailedError"]


class OrchestratorError(ElasticPipeError, RuntimeError):
    """Something went wrong while training (a peer disagreed, a checkpoint does not fit, a rank failed)."""


class NonFiniteLossError(OrchestratorError):
    """A training step's global loss is NaN or infinite (``[train] on_nonfinite = "stop"``); the message names the
    epoch and the step."""


class ConfigError(ElasticPipeError, ValueError):
    """A training configuration that cannot work; raised before any process group is created."""


class WorkerFailedError(OrchestratorError):
    """A worker of a launch failed after all restarts; the message is one line naming the rank and its error.

    Attributes:
        rank: the global rank that failed first.
        error: its exception as ``"Type: message"`` on one line (or how it died, when it left no report).
        traceback: the worker's full traceback, when it left one.
        restarts: how many restarts the launch allowed.
        report: where the traceback was written (``[log] dir``/error-rank<N>.txt), if anywhere.
    """

    def __init__(
        self, rank: int, error: str, *, traceback: str | None, restarts: int, report: str | None = None
    ) -> None:
        self.rank = rank
        self.error = error
        self.traceback = traceback
        self.restarts = restarts
        self.report = report
        after = f" (after {restarts} restart{'s' if restarts != 1 else ''})" if restarts else ""
        where = f"; traceback in {report}" if report else ""
        super().__init__(f"rank {rank} failed: {error}{after}{where}")
