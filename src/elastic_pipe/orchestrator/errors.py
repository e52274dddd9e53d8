"""The orchestrator's exception family."""

from __future__ import annotations

from elastic_pipe.types import ElasticPipeError

__all__ = ["ConfigError", "NonFiniteLossError", "OrchestratorError", "WorkerFailedError", "one_line"]


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


#: What a DataLoader puts between its one-line summary and the worker's traceback.
_ORIGINAL_TRACEBACK = "Original Traceback (most recent call last):"


def one_line(text: str) -> str:
    """An error message on one line: whitespace runs become one space; a DataLoader worker's failure ("Caught E in
    DataLoader worker process 0. Original Traceback ... E: reason") becomes its last line and where it came from."""
    head, found, tb = text.partition(_ORIGINAL_TRACEBACK)
    if found:
        lines = [line.strip() for line in tb.strip().splitlines() if line.strip()]
        where = head.strip().removeprefix("Caught ").split(" in ", 1)[-1].rstrip(".")
        last = lines[-1] if lines else head.strip()
        return f"{' '.join(last.split())} (in {where})"
    return " ".join(text.split())
