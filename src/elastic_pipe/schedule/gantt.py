"""Gantt chart of a simulated schedule: ranks as rows, F/B/I/W coloured, idle time left grey.

matplotlib is an optional extra (``pip install elastic-pipe[plots]``); it is imported only when a chart is drawn,
and drawing goes through the Agg canvas directly so that no global pyplot state or backend is touched.
"""

from __future__ import annotations

from pathlib import Path

from elastic_pipe.schedule.errors import CHECK, MissingExtraError
from elastic_pipe.schedule.ir import ActionKind
from elastic_pipe.schedule.simulate import Simulation

__all__ = ["KIND_COLOURS", "gantt"]

#: Fill colour of each action kind (colour-blind safe palette).
KIND_COLOURS: dict[ActionKind, str] = {
    ActionKind.F: "#4C72B0",
    ActionKind.B: "#55A868",
    ActionKind.I: "#DD8452",
    ActionKind.W: "#8172B3",
}
_IDLE_COLOUR = "#E5E5E5"
_KIND_NAMES = {
    ActionKind.F: "F forward",
    ActionKind.B: "B backward",
    ActionKind.I: "I input grad",
    ActionKind.W: "W weight grad",
}
#: Label micro-batch numbers inside the bars only when a rank runs at most this many actions (else unreadable).
_MAX_LABELLED_ACTIONS = 80
_ROW_HEIGHT_IN = 0.45
_WIDTH_IN = 12.0
_BAR_HEIGHT = 0.8


#: The highest resolution drawn (dots per inch); a larger one would build an image of gigabytes.
MAX_DPI = 1_200


def gantt(simulation: Simulation, path: str | Path, *, title: str | None = None, dpi: int = 120) -> Path:
    """Draw ``simulation`` as a PNG at ``path`` and return the path.

    Args:
        simulation: the result of :func:`elastic_pipe.schedule.simulate`.
        path: output file (PNG).
        title: chart title; default names the schedule, its makespan and bubble fraction.
        dpi: resolution.

    Raises:
        MissingExtraError: matplotlib is not installed.
    """
    CHECK.instance("simulation", simulation, Simulation)
    CHECK.instance("path", path, str | Path)
    if title is not None:
        CHECK.str("title", title)
    CHECK.int("dpi", dpi, lo=1, hi=MAX_DPI)
    try:  # optional extra: imported only when a chart is drawn
        from matplotlib.backends.backend_agg import FigureCanvasAgg  # noqa: PLC0415
        from matplotlib.figure import Figure  # noqa: PLC0415
        from matplotlib.patches import Patch  # noqa: PLC0415
    except ImportError as exc:
        raise MissingExtraError(
            "Gantt charts need matplotlib: pip install 'elastic-pipe[plots]' (or pip install matplotlib)"
        ) from exc
    schedule = simulation.schedule
    ranks = schedule.num_ranks
    fig = Figure(figsize=(_WIDTH_IN, 1.2 + _ROW_HEIGHT_IN * ranks))
    FigureCanvasAgg(fig)
    ax = fig.add_subplot()
    start0 = min((s[0] for s in simulation.starts.values() if s), default=0.0)
    label = max(len(a) for a in schedule.actions.values()) <= _MAX_LABELLED_ACTIONS
    for rank in range(ranks):
        y = ranks - 1 - rank
        ax.broken_barh([(0.0, simulation.makespan)], (y - _BAR_HEIGHT / 2, _BAR_HEIGHT), facecolors=_IDLE_COLOUR)
        spans: dict[ActionKind, list[tuple[float, float]]] = {k: [] for k in ActionKind}
        for action, start, end in simulation.intervals(rank):
            spans[action.kind].append((start - start0, end - start))
            if label:
                ax.text(
                    (start + end) / 2 - start0, y, str(action.microbatch), ha="center", va="center", fontsize=7,
                    color="white",
                )  # fmt: skip
        for kind, bars in spans.items():
            if bars:
                ax.broken_barh(
                    bars, (y - _BAR_HEIGHT / 2, _BAR_HEIGHT), facecolors=KIND_COLOURS[kind], edgecolor="white",
                    linewidth=0.5 if label else 0.0,
                )  # fmt: skip
    ax.set_yticks(range(ranks), [f"rank {r}" for r in reversed(range(ranks))])
    ax.set_xlim(0.0, simulation.makespan)
    ax.set_xlabel("time")
    used = sorted({a.kind for acts in schedule.actions.values() for a in acts}, key=list(ActionKind).index)
    handles = [Patch(facecolor=KIND_COLOURS[k], label=_KIND_NAMES[k]) for k in used]
    handles.append(Patch(facecolor=_IDLE_COLOUR, label="idle"))
    ax.legend(handles=handles, loc="upper center", bbox_to_anchor=(0.5, -0.3), ncol=len(handles), frameon=False)
    ax.set_title(
        title
        or (
            f"{schedule.kind}: {ranks} ranks, {schedule.num_stages} stages, {schedule.microbatches} micro-batches - "
            f"makespan {simulation.makespan:.4g}, bubble {simulation.bubble_fraction:.1%}"
        )
    )
    fig.tight_layout()
    out = Path(path)
    fig.savefig(out, dpi=dpi, format="png")
    return out
