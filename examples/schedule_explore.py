"""Explore pipeline schedules without any GPU: generate, validate, simulate, draw, tune.

python examples/schedule_explore.py                 # prints a comparison, draws charts into ./schedule_img
python examples/schedule_explore.py --out docs/img  # regenerates the pictures in docs/schedule.md
"""

from __future__ import annotations

import argparse
from pathlib import Path

from elastic_pipe.schedule import (
    EAGER_HOST_SECONDS_PER_BLOCK,
    LinearCost,
    gantt,
    generate,
    simulate,
    tune_microbatches,
    validate,
)

RANKS, MICROBATCHES = 4, 8


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--out", type=Path, default=Path("schedule_img"), help="folder for the Gantt charts")
    args = parser.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)

    # One micro-batch costs F = 1 and B = 2 per stage (a split backward: I = 1, W = 1).
    print(f"{'schedule':18} {'makespan':>8} {'bubble':>7}  peak activations per stage")
    for kind, chunks in (("gpipe", 1), ("1f1b", 1), ("interleaved", 2), ("zb1p", 1)):
        schedule = generate(kind, RANKS, MICROBATCHES, chunks)
        validate(schedule)
        sim = simulate(schedule, forward=1.0 / chunks, backward=2.0 / chunks)
        name = f"{kind} v={chunks}"
        print(f"{name:18} {sim.makespan:8.2f} {sim.bubble_fraction:7.1%}  {list(sim.peak_activations)}")
        if kind in ("1f1b", "zb1p"):
            print(f"  chart: {gantt(sim, args.out / f'schedule_{kind}.png')}")

    # Micro-batch count for a 4-stage ViT-B/16 pipeline (3 blocks per stage) and a global batch of 512,
    # with the ~1 ms of eager host time per block and micro-batch measured on H200.
    cost = LinearCost.uniform(
        4,
        forward_per_sample=3 * 2.2e-3 / 256,
        backward_per_sample=3 * 5.15e-3 / 256,
        blocks_per_stage=3,
        host_per_block=EAGER_HOST_SECONDS_PER_BLOCK,
    )
    choice = tune_microbatches(cost, global_batch=512, pipe_len=4)
    for row in choice.table:
        print(f"M={row.microbatches:3d} (b={row.microbatch_size:3d}): {row.throughput:7.0f} samples/s, "
              f"bubble {row.bubble_fraction:.1%}")  # fmt: skip
    print(f"chosen: M={choice.microbatches}")


if __name__ == "__main__":
    main()
