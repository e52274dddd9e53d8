"""One layout's pipeline stage on this rank (:class:`StageRuntime`, built at a transition and thrown away at the
next): its module and schedule runner, the gradient tracking and averaging over its replica group, its training
step replayed as a CUDA graph where that pays, and the freeze probe measured through it (:mod:`.probe`).

Modules: :mod:`.runtime` (the face object), :mod:`.build` (the schedule runner and the freeze units a stage holds),
:mod:`.local_step` (the one-stage, one-micro-batch step and the compilation seconds it counts), :mod:`.grad_sync`
(gradient averaging, overlapped with the backward where it can be), :mod:`.graph_choice` (whether a layout's steps
replay a CUDA graph: the pure rule), :mod:`.capture` (torch's capture recipe, the one every graph here is made
with), :mod:`.graphed_step` (a training step captured and replayed, and what the epoch record says of it),
:mod:`.forward_graphs` (the probe's forwards captured and replayed), :mod:`.forward_timer` (the stage's forward
time), :mod:`.probe` (the drift probe a probe-driven policy reads). They are not API: the rest of the orchestrator
uses what this face exports - :class:`StageRuntime`, :func:`step_record` and the :mod:`.probe` module (``measure``,
``baseline``, ``kept``, ``restore``; called through the module, so a test can wrap them).
"""

from __future__ import annotations

from elastic_pipe.orchestrator.stage import probe
from elastic_pipe.orchestrator.stage.graphed_step import step_record
from elastic_pipe.orchestrator.stage.runtime import StageRuntime

__all__ = ["StageRuntime", "probe", "step_record"]
