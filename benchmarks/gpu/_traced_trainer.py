"""An :class:`~elastic_pipe.orchestrator.ElasticTrainer` whose transitions run under ``torch.profiler``: what a
transition spends its time on, operator by operator (``profile_transitions.py --trace N`` on the single-GPU
headline's run, ``time_to_accuracy.py --trace-transitions N`` on a time-to-accuracy arm).

The profiler slows the transitions it watches, so their seconds are not the run's: read the operators' shares.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch

from elastic_pipe.orchestrator import ElasticTrainer

__all__ = ["TracedTrainer", "slowest"]


class TracedTrainer(ElasticTrainer):
    """An :class:`ElasticTrainer` keeping, per transition, its seconds and ``torch.profiler``'s top operators."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        #: Per transition that changed the layout, its seconds and the operator table, in the run's order.
        self.traces: list[tuple[float, str]] = []
        super().__init__(*args, **kwargs)

    def transition(self, *, epoch_step: int = 0, before: Callable[[], None] | None = None) -> Any:
        from torch.profiler import ProfilerActivity, profile

        activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if torch.cuda.is_available() else [])
        with profile(activities=activities, acc_events=True) as prof:
            event = super().transition(epoch_step=epoch_step, before=before)
        if event is not None:
            sort = "self_cuda_time_total" if torch.cuda.is_available() else "self_cpu_time_total"
            self.traces.append((event.seconds, prof.key_averages().table(sort_by=sort, row_limit=15)))
        return event


def slowest(traces: list[tuple[float, str]], n: int) -> str:
    """The top-operator tables of the ``n`` slowest transitions, slowest first, each under a line with its seconds."""
    return "\n".join(
        f"--- transition of {seconds:.3f} s: top operators\n{text}"
        for seconds, text in sorted(traces, reverse=True)[:n]
    )
