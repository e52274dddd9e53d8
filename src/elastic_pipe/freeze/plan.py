"""Dry-run a schedule-driven policy: the frozen count at the start of each epoch, without training."""

from __future__ import annotations

from elastic_pipe.freeze.base import PolicyLike, as_policy
from elastic_pipe.freeze.errors import CHECK, FreezeError
from elastic_pipe.freeze.policy import decide, needs_probe

__all__ = ["MAX_EPOCHS", "frozen_by_epoch"]


#: The most epochs :func:`frozen_by_epoch` plans: it asks the policy once per epoch, so this bounds its time; far
#: beyond any training run.
MAX_EPOCHS = 100_000


def frozen_by_epoch(given: PolicyLike, epochs: int, steps_per_epoch: int = 1) -> tuple[int, ...]:
    """Frozen count at the start of epochs ``0 .. epochs-1``, asking ``policy`` exactly as a training loop would.

    Args:
        given: a schedule-driven policy (one whose ``needs_stats`` is False; completed by
            :func:`~.base.as_policy`, so an object with ``num_layers`` and ``propose`` will do).
        epochs: number of epochs, >= 1.
        steps_per_epoch: optimizer steps per epoch, passed as ``step = epoch * steps_per_epoch``.

    Raises:
        FreezeError: a policy that lacks protocol members or needs measured signals, or bad ``epochs`` or
            ``steps_per_epoch``.
    """
    policy = as_policy(given)
    if policy.needs_stats or needs_probe(policy):
        signal = "gradient statistics" if policy.needs_stats else "the drift of a probe batch's outputs"
        raise FreezeError(
            f"freeze policy {policy.name!r} ({type(policy).__name__}) decides from {signal}, "
            "so it has no plan without training; expected a schedule-driven policy (alpha, freezeout, manual, never)"
        )
    CHECK.int("frozen_by_epoch: epochs", epochs, lo=1, hi=MAX_EPOCHS)
    CHECK.int("frozen_by_epoch: steps_per_epoch", steps_per_epoch, lo=1)
    current = 0
    out = []
    for epoch in range(epochs):
        current = decide(policy, epoch, epoch * steps_per_epoch, current)
        out.append(current)
    return tuple(out)
