"""The parts of one optimizer step that are not the loop: where decision points fall, each step's seeds, and the
global gradient clip.

A function of the step's coordinates alone decides each one, so a run resumed at any step draws and clips exactly as
the uninterrupted run did.
"""

from __future__ import annotations

import hashlib
from typing import TYPE_CHECKING

import torch
import torch.distributed as dist

if TYPE_CHECKING:
    from elastic_pipe.orchestrator.stage import StageRuntime

__all__ = ["clip_global_grad_norm", "decision_point", "reseed", "step_seed"]


def decision_point(step: int, every: int) -> bool:
    """Whether a decision point follows the run's ``step``-th optimizer step with ``[freeze] decide_every = every``
    (0: only epoch ends are decision points, which the trainer handles)."""
    return every > 0 and step > 0 and step % every == 0


def step_seed(seed: int, epoch: int, step: int, rank: int) -> int:
    """The seed of a rank's random generators (CPU and CUDA) for one step of an epoch (``step`` counts from 0).

    A function of the step's coordinates alone, so a run resumed at any step draws that step's dropout masks
    exactly as the uninterrupted run did, whatever it drew before; distinct for every (seed, epoch, step, rank)
    up to the 2**-64 chance of a hash collision, with no bound on any coordinate. 64 bits of BLAKE2b.
    """
    digest = hashlib.blake2b(f"{seed}:{epoch}:{step}:{rank}".encode(), digest_size=8).digest()
    return int.from_bytes(digest, "little")


def reseed(seed: int, device: torch.device) -> None:
    """Seed the generators a rank's step draws from: the CPU's and, on a GPU, the rank's device's.

    What ``torch.manual_seed`` leaves in those two generators, without its work on every other backend: it seeds
    every CUDA device, MPS, XPU and MTIA as well, and on a host where CUDA is not initialised (any CPU run) it
    queues the CUDA seeding with a formatted stack trace, about 0.6 ms per step on the CPU
    (``benchmarks/bench_head_only_host.py``). A rank draws only on its own device and the CPU.
    """
    torch.default_generator.manual_seed(seed)
    if device.type == "cuda":
        index = device.index if device.index is not None else torch.cuda.current_device()
        torch.cuda.default_generators[index].manual_seed(seed)


@torch.no_grad()
def clip_global_grad_norm(stage: StageRuntime, max_norm: float, device: torch.device) -> float:
    """Scale this rank's gradients so that the whole model's gradient has L2 norm at most ``max_norm`` (a collective).

    The norm is global: each rank of replica 0 sums the squares of the gradients of the sub-layers it owns (after
    the replica average every replica holds the same ones, so the others add nothing), one all-reduce over the
    world adds the stages up, and every rank scales by the same factor, as ``torch.nn.utils.clip_grad_norm_``
    would on the whole model in one process.

    Returns:
        The global norm before clipping.
    """
    grads = [p.grad for j in stage.owned for p in stage.ctx.sublayers[j].parameters() if p.grad is not None]
    square = torch.zeros((), dtype=torch.float64, device=device)
    if grads and stage.replica == 0:
        square = torch.stack([torch.linalg.vector_norm(g, dtype=torch.float64) for g in grads]).square().sum()
    dist.all_reduce(square)
    norm = float(square.sqrt())
    # torch's clip_grad_norm_ rule: the 1e-6 keeps the factor finite at a zero norm
    factor = min(1.0, max_norm / (norm + 1e-6))
    if factor < 1.0 and grads:
        torch._foreach_mul_(grads, factor)
    return norm
