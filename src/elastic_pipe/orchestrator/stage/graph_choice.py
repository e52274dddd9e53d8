"""Whether a layout's training steps replay a CUDA graph (``[train] cuda_graphs``): the pure rule, unit-tested on the
CPU. :func:`decide_graph` says whether capture is safe for a layout and step size, and if not, why;
:func:`graph_pays` says, for ``"auto"``, whether a measured warm-up step is host-bound enough for a replay to pay.
The capture and replay themselves: :class:`~elastic_pipe.orchestrator.stage.graphed_step.GraphedStep`.
"""

from __future__ import annotations

from dataclasses import dataclass

__all__: list[str] = []  # internal: the package face exports what others use


@dataclass(frozen=True)
class GraphChoice:
    """Whether a layout's steps of one size replay a CUDA graph.

    Attributes:
        use: capture and replay.
        reason: why not (empty when ``use``); reported in the epoch record's ``graph_reason``.
    """

    use: bool
    reason: str = ""

    def __post_init__(self) -> None:
        if self.use == bool(self.reason):
            raise ValueError(f"GraphChoice: give a reason exactly when use is False, got {self!r}")


def decide_graph(
    mode: str,
    *,
    device_type: str,
    pipe_len: int,
    microbatches: int,
    replicas: int,
    rows: int,
    full_rows: int,
) -> GraphChoice:
    """Whether steps of ``rows`` samples in this layout can replay a CUDA graph (``[train] cuda_graphs``).

    A graph fixes shapes, memory and the host's part of the step, so it is used only where the step is one
    direct forward + backward on a device that has graphs:

    * one stage and one micro-batch (the :class:`~elastic_pipe.orchestrator.stage.local_step.LocalStep` path): a
      pipelined schedule sends activations between ranks and keeps per-step bookkeeping in Python, which a graph
      would freeze;
    * one replica: several replicas average gradients in hooks that fire during the backward (gloo cannot be
      captured, and the hooks' bucketing is host logic);
    * a full step: a short last step has other shapes (it runs eagerly, as before).

    Args:
        mode: ``"auto"``, ``"on"`` or ``"off"`` (both "auto" and "on" apply these rules, and "auto" then also
            asks :func:`graph_pays` after the warm-up; "off" never captures).
        device_type: the rank's device type (``"cuda"``, ``"cpu"``, ...).
        pipe_len: the layout's pipeline length.
        microbatches: micro-batches per step.
        replicas: data-parallel replicas.
        rows: samples per micro-batch of this step.
        full_rows: samples per micro-batch of a full step.

    Returns:
        The choice, with the first reason that rules capture out.
    """
    if mode == "off":
        return GraphChoice(False, "off ([train] cuda_graphs)")
    if device_type != "cuda":
        return GraphChoice(False, f"CUDA graphs need a CUDA device, not {device_type}")
    if pipe_len > 1 or microbatches > 1:
        return GraphChoice(
            False, f"a pipelined schedule (pipe_len={pipe_len}, microbatches={microbatches}) runs host logic per step"
        )
    if replicas > 1:
        return GraphChoice(False, f"{replicas} replicas average gradients in backward hooks")
    if rows != full_rows:
        return GraphChoice(False, f"a short step of {rows} rows (full steps have {full_rows}) has other shapes")
    return GraphChoice(True)


#: ``"auto"`` captures a layout only if its measured warm-up step is host-bound: the host's enqueueing took at least
#: this fraction of the step's wall time, so the GPU waited on Python and launches for part of it. Below it the
#: GPU sets the pace and a replay would save no time, only hold a second copy of the step's activations (on one
#: H200, ViT-B/16 steps with a block or more to train measured 0.05 to 0.4 of their wall time in host work; the
#: head-only step 0.9, see docs/benchmarks.md).
HOST_BOUND_FRACTION = 0.5


def graph_pays(host_s: float, wall_s: float) -> GraphChoice:
    """Whether a capture pays for a step that took ``wall_s`` seconds (device synchronised) of which the host
    spent ``host_s`` enqueueing it (``"auto"``; see :data:`HOST_BOUND_FRACTION`)."""
    if wall_s > 0 and host_s >= HOST_BOUND_FRACTION * wall_s:
        return GraphChoice(True)
    return GraphChoice(
        False, f"GPU-bound: {host_s * 1e3:.1f} ms of host work in a {wall_s * 1e3:.1f} ms step (auto needs half)"
    )
