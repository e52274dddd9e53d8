"""Profile a small transformer's sub-layers on the CPU (or a GPU) and partition by measured time.

Run: python examples/partition_profile.py [--device cuda] [--blocks 6] [--frozen 2]

Each sub-layer takes one tensor and returns one (attention and MLP with their residuals), so a pipeline may cut
between any two. profile_layers measures forward, backward and frozen-forward time (median of repeats after
warm-up, CUDA events on a GPU), output bytes and training memory; the optimal solver then cuts on measured time.
"""

from __future__ import annotations

import argparse

import torch
from torch import nn

from elastic_pipe.partition import profile_layers, solve, weights_from_costs


class Attention(nn.Module):
    """``x + attention(norm(x))``: one partitionable sub-layer."""

    def __init__(self, width: int, heads: int) -> None:
        super().__init__()
        self.norm = nn.LayerNorm(width)
        self.attn = nn.MultiheadAttention(width, heads, batch_first=True)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.norm(x)
        out: torch.Tensor = self.attn(h, h, h, need_weights=False)[0]
        return x + out


class Mlp(nn.Module):
    """``x + mlp(norm(x))``: one partitionable sub-layer."""

    def __init__(self, width: int, hidden: int) -> None:
        super().__init__()
        self.body = nn.Sequential(nn.LayerNorm(width), nn.Linear(width, hidden), nn.GELU(), nn.Linear(hidden, width))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out: torch.Tensor = x + self.body(x)
        return out


def main() -> None:
    """Build, profile, partition."""
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--blocks", type=int, default=4)
    parser.add_argument("--width", type=int, default=64)
    parser.add_argument("--batch", type=int, default=16)
    parser.add_argument("--seq", type=int, default=32)
    parser.add_argument("--stages", type=int, default=4)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--frozen", type=int, default=2, help="frozen blocks")
    args = parser.parse_args()

    torch.manual_seed(0)
    device = torch.device(args.device)
    layers: list[tuple[str, nn.Module]] = [("embed", nn.Linear(args.width, args.width))]
    for block in range(args.blocks):
        layers.append((f"block{block}.attn", Attention(args.width, heads=4)))
        layers.append((f"block{block}.mlp", Mlp(args.width, 4 * args.width)))
    layers.append(("head", nn.Sequential(nn.LayerNorm(args.width), nn.Linear(args.width, 10))))
    for _, module in layers:
        module.to(device)

    x = torch.randn(args.batch, args.seq, args.width, device=device)
    costs = profile_layers(layers, x, repeats=args.repeats, warmup=2)
    print(f"{'layer':<14}{'fwd ms':>9}{'bwd ms':>9}{'frozen ms':>10}{'out KiB':>9}{'mem KiB':>9}")
    for c in costs:
        print(
            f"{c.name:<14}{c.forward * 1e3:>9.3f}{c.backward * 1e3:>9.3f}{(c.frozen_forward or 0) * 1e3:>10.3f}"
            f"{c.activation_bytes / 1024:>9.0f}{c.memory_bytes / 1024:>9.0f}"
        )
    frozen = 1 + 2 * args.frozen  # the embedding belongs to the first frozen unit
    for label, weights in (
        ("all active", weights_from_costs(costs, "time")),
        (f"{args.frozen} blocks frozen (measured)", weights_from_costs(costs, "time", frozen=frozen)),
    ):
        p = solve(weights, args.stages, "optimal")
        print(f"{label:<28} layers {p.layers_per_stage}  largest stage {p.bottleneck * 1e3:.3f} ms")


if __name__ == "__main__":
    main()
