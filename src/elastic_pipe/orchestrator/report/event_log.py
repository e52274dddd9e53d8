"""Where records go: :class:`EventLog` appends each as one JSON line, hands it to every :class:`RecordSink` (e.g.
TensorBoard) and prints its human line; a resumed run rewinds it first, so no epoch appears twice. The records
themselves are :mod:`.records`.
"""

from __future__ import annotations

import json
import sys
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Protocol, TextIO

__all__ = ["EventLog", "RecordSink"]


class RecordSink(Protocol):
    """Anything else a record goes to besides the JSON lines (e.g. TensorBoard scalars)."""

    def write(self, payload: Mapping[str, object]) -> None:
        """Take one record (the plain data of :meth:`EpochMetrics.to_dict` or :meth:`TransitionEvent.to_dict`)."""

    def close(self) -> None:
        """Release the sink's files (the run has ended)."""


class EventLog:
    """Writes records as JSON lines to ``path`` (if any), to each of ``sinks`` and human lines to ``stream`` (if any).

    Only rank 0 writes; other ranks hold a log with none of them.
    """

    def __init__(
        self, path: str | Path | None = None, stream: TextIO | None = None, sinks: Sequence[RecordSink] = ()
    ) -> None:
        self._path = Path(path) if path else None
        self._stream = stream
        self._sinks = tuple(sinks)
        if self._path is not None:
            self._path.parent.mkdir(parents=True, exist_ok=True)

    @property
    def stream(self) -> TextIO | None:
        """Where human lines go (``None``: nowhere, on ranks but 0 and in quiet runs)."""
        return self._stream

    @classmethod
    def to_stderr(cls, path: str | Path | None = None) -> EventLog:
        """A log whose human lines go to stderr."""
        return cls(path, sys.stderr)

    def record(self, payload: Mapping[str, object], line: str | None = None) -> None:
        """Append ``payload`` as one JSON line, hand it to every sink and print ``line``."""
        if self._path is not None:
            with self._path.open("a", encoding="utf-8") as f:
                f.write(json.dumps(payload, allow_nan=False) + "\n")
        for sink in self._sinks:
            sink.write(payload)
        self.say(line)

    def rewind(self, epoch: int, step: int) -> None:
        """Drop the records a resumed run writes again: those of epochs from ``epoch`` on and of transitions after
        optimizer step ``step`` (the checkpoint's position). Other records (earlier ``resume`` ones) stay."""
        if self._path is None or not self._path.exists():
            return
        kept = []
        for line in self._path.read_text(encoding="utf-8").splitlines():
            record = json.loads(line)
            kind = record.get("kind")
            if (kind == "epoch" and record["epoch"] >= epoch) or (kind == "transition" and record["step"] > step):
                continue
            kept.append(line + "\n")
        tmp = self._path.with_name(self._path.name + ".tmp")
        tmp.write_text("".join(kept), encoding="utf-8")
        tmp.replace(self._path)

    def close(self) -> None:
        """Close every sink (the JSON lines are appended and closed record by record). Idempotent."""
        sinks, self._sinks = self._sinks, ()
        for sink in sinks:
            sink.close()

    def say(self, line: str | None) -> None:
        """Print a human line (no JSON record)."""
        if self._stream is not None and line:
            self._stream.write(line + "\n")
            self._stream.flush()
