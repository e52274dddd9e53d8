"""torch's CUDA-graph capture recipe (``torch.cuda.graph``), written once for every graph the stage makes: a layout's
training step (:class:`~elastic_pipe.orchestrator.stage.graphed_step.GraphedStep`) and the probe's forwards
(:class:`~elastic_pipe.orchestrator.stage.forward_graphs.ForwardGraphs`).

The recipe: on a side stream of its own (:func:`side_stream`), a graph's first calls run eagerly
(:func:`on_side_stream`: the warm-up, so that lazy initialisation - cuBLAS workspaces, the autograd engine's device
threads - happens outside a capture), then one call is recorded with static input buffers (:func:`capture`), and
every later call copies its input into those buffers and replays (the caller's part: what it copies in and hands
on differs). Each side-stream call waits for the work already queued on the main stream, and the main stream waits
for it, so the order of an eager call is kept.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TypeVar

import torch

__all__: list[str] = []  # internal: the package face exports what others use

T = TypeVar("T")


def side_stream(device: torch.device | None = None) -> torch.cuda.Stream:
    """A new stream to warm up and capture on, on ``device`` (``None``: the current device)."""
    new_stream: Callable[..., torch.cuda.Stream] = torch.cuda.Stream  # its constructor is untyped in torch
    return new_stream() if device is None else new_stream(device)


def on_side_stream(stream: torch.cuda.Stream, body: Callable[[], T], device: torch.device | None = None) -> T:
    """``body()`` run eagerly on ``stream`` (a warm-up call), after the work queued on ``device``'s current stream
    and before the work queued on it next."""
    main = torch.cuda.current_stream(device)
    stream.wait_stream(main)
    with torch.cuda.stream(stream):
        out = body()
    main.wait_stream(stream)
    return out


def capture(
    graph: torch.cuda.CUDAGraph, stream: torch.cuda.Stream, body: Callable[[], T], device: torch.device | None = None
) -> tuple[T | None, BaseException | None]:
    """Record ``body()`` into ``graph`` on ``stream`` (ordered like :func:`on_side_stream`): the capture every CUDA
    graph here is made with.

    torch.cuda.graph() would also collect garbage and empty the allocator's cache first, which costs more than a
    short layout's capture saves; capturing directly skips that. thread_local: a data loader's pinning thread may
    touch CUDA while this thread captures.

    Returns:
        ``(body's result, None)``; or ``(None, error)`` when ``body`` raised (any failure inside a capture means:
        run eagerly) or ending the capture failed, the first error kept.
    """
    result: T | None = None
    error: BaseException | None = None
    main = torch.cuda.current_stream(device)
    stream.wait_stream(main)
    with torch.cuda.stream(stream):
        graph.capture_begin(capture_error_mode="thread_local")
        try:
            result = body()
        except Exception as e:  # any failure inside a capture means: run eagerly
            error = e
        finally:
            try:
                graph.capture_end()
            except RuntimeError as e:
                error = error or e
    main.wait_stream(stream)
    return (None, error) if error is not None else (result, None)


def capture_failure(error: BaseException | None) -> str:
    """The reason a failed capture leaves its layout or segment eager: the error's first line (or its type)."""
    text = str(error).splitlines()[0] if error is not None and str(error) else type(error).__name__
    return f"capture failed: {text}"
