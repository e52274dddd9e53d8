"""TensorBoard scalars beside ``events.jsonl``: the one place that decides which record fields become scalars.

The ``tensorboard`` package is an optional extra (``pip install 'elastic-pipe[tensorboard]'``); this module imports
``torch.utils.tensorboard`` only when a sink is built, so that a run without ``[log] tensorboard`` never needs it.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from pathlib import Path

__all__ = ["EPOCH_SCALARS", "TRANSITION_SCALARS", "TensorBoardSink", "tensorboard_missing"]

#: Fields of an ``"epoch"`` record written as scalars ``epoch/<field>``, at step ``epoch``.
EPOCH_SCALARS = (
    "loss",
    "eval_loss",
    "eval_accuracy",
    "samples_per_s",
    "pipe_len",
    "replicas",
    "frozen_units",
    "lr",
    "seconds",
)
#: Fields of a ``"transition"`` record written as scalars ``transition/<field>``, at step ``epoch`` (the epoch
#: that starts with the new layout, so that both kinds share one x-axis).
TRANSITION_SCALARS = ("seconds", "bytes_moved")

_SCALARS = {"epoch": EPOCH_SCALARS, "transition": TRANSITION_SCALARS}


def tensorboard_missing() -> str | None:
    """``None`` when ``torch.utils.tensorboard`` imports, else a one-line reason naming the extra to install."""
    try:
        import torch.utils.tensorboard  # noqa: F401, PLC0415 (the optional extra loads only when asked for)
    except ImportError:
        return "[log] tensorboard = true needs the tensorboard package: pip install 'elastic-pipe[tensorboard]'"
    return None


class TensorBoardSink:
    """Writes the scalar fields of epoch and transition records to a TensorBoard event file in ``directory``.

    A field whose value is ``None`` (an epoch ``[log] eval_every`` skipped, accuracy of a non-classification run)
    or not finite is left out; records of other kinds are ignored.

    Args:
        directory: where the event files go (``<[log] dir>/tensorboard`` in a run).
    """

    def __init__(self, directory: str | Path) -> None:
        from torch.utils.tensorboard import SummaryWriter  # noqa: PLC0415 (see tensorboard_missing)

        self._writer = SummaryWriter(log_dir=str(directory))

    def write(self, payload: Mapping[str, object]) -> None:
        """Add ``payload``'s scalars and flush, so that a crashed run keeps every record it wrote."""
        kind = payload.get("kind")
        fields = _SCALARS.get(kind) if isinstance(kind, str) else None
        if fields is None:
            return
        step = payload["epoch"]
        assert isinstance(step, int), step  # epoch and transition records count epochs in ints
        for name in fields:
            value = payload.get(name)
            if not isinstance(value, int | float) or not math.isfinite(value):  # None: a skipped evaluation
                continue
            self._writer.add_scalar(f"{kind}/{name}", float(value), global_step=step)
        self._writer.flush()

    def close(self) -> None:
        """Flush and close the event file."""
        self._writer.close()
