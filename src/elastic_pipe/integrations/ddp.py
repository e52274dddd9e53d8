"""Re-wrap a ``DistributedDataParallel`` model after a freeze, so that no frozen parameter is reduced.

DDP builds its reducer once, at construction, over the parameters that require grad then: a parameter frozen later
stays in a bucket and the reducer waits for its gradient, which never comes. Without ``find_unused_parameters`` the
next step fails ("Expected to have finished reduction in the prior iteration"); with it every step pays a traversal
of the autograd graph to find what was unused, and the frozen parameters' zero gradients are still all-reduced.

:func:`rewrap_ddp` rebuilds the reducer of the same DDP object around what still trains - the steps torch itself
takes when a DDP object is unpickled (``DistributedDataParallel.__setstate__``): list the parameters that require
grad, bucket them, build a new reducer and logger, and re-register the communication hooks. The object the trainer
holds (HF ``trainer.model_wrapped``, Lightning ``trainer.strategy.model``) stays the same, so neither trainer needs
to know; no collective is issued (the replicas' weights are already equal), and the next forward rebuilds the
buckets in execution order, as after construction. Call it between steps (after the optimizer step, before the
next forward), on every rank.

The rebuild uses private members of ``torch.nn.parallel.DistributedDataParallel`` (those ``__setstate__`` uses),
checked against torch 2.11-2.14; :func:`can_rewrap` says whether this torch has them.
"""

from __future__ import annotations

import torch.distributed as dist
from torch import nn
from torch.nn.parallel import DistributedDataParallel

from elastic_pipe.integrations.errors import IntegrationError

__all__ = ["can_rewrap", "reduced_parameters", "rewrap_ddp"]

#: The DDP members the rebuild calls.
_NEEDED = ("_build_params_for_reducer", "_build_debug_param_to_name_mapping", "_ddp_init_helper", "reducer")


def can_rewrap(ddp: DistributedDataParallel) -> bool:
    """Whether ``ddp`` has the members :func:`rewrap_ddp` uses."""
    return all(hasattr(ddp, name) for name in _NEEDED)


def reduced_parameters(ddp: DistributedDataParallel) -> list[nn.Parameter]:
    """The parameters ``ddp``'s reducer would be built over now: those that require grad and are not ignored."""
    params, _ = ddp._build_params_for_reducer()  # type: ignore[no-untyped-call]
    return list(params)


def rewrap_ddp(ddp: DistributedDataParallel, *, find_unused_parameters: bool | None = False) -> int:
    """Rebuild ``ddp``'s reducer over the parameters that require grad now.

    Args:
        ddp: the wrapper; its module's newly frozen parameters already have ``requires_grad = False``.
        find_unused_parameters: the rebuilt reducer's setting; False (the default) so that no step pays for it
            (the frozen parameters were the unused ones); None keeps the wrapper's own.

    Returns:
        The number of parameters the new reducer reduces.

    Raises:
        IntegrationError: this torch's DDP lacks the members the rebuild uses, or nothing requires grad any more
            (a DDP without trainable parameters cannot be built; keep at least the head trainable).
    """
    if not can_rewrap(ddp):
        missing = [name for name in _NEEDED if not hasattr(ddp, name)]
        raise IntegrationError(f"rewrap_ddp: this torch's DistributedDataParallel lacks {missing}; cannot re-wrap")
    if getattr(ddp, "_delay_all_reduce_all_params", False):
        raise IntegrationError("rewrap_ddp: a DDP that delays the all-reduce of every parameter cannot be re-wrapped")
    params, expect_sparse = ddp._build_params_for_reducer()  # type: ignore[no-untyped-call]
    if not params:
        raise IntegrationError(
            f"rewrap_ddp: no parameter of {type(ddp.module).__name__} requires grad any more; expected at least one"
        )
    if find_unused_parameters is not None:
        ddp.find_unused_parameters = find_unused_parameters
    ddp.reducer._remove_autograd_hooks()  # the old reducer's hooks on the parameters go with it
    mapping = ddp._build_debug_param_to_name_mapping(params)  # type: ignore[no-untyped-call]
    ddp._ddp_init_helper(params, expect_sparse, mapping, ddp.static_graph)  # type: ignore[no-untyped-call]
    if ddp.static_graph:
        ddp.reducer._set_static_graph()
        ddp.logger._set_static_graph()  # type: ignore[union-attr]
    for hook, state in getattr(ddp, "_comm_hooks", []):
        dist._register_comm_hook(ddp.reducer, state, hook)  # type: ignore[attr-defined]
    ddp._has_rebuilt_buckets = False
    return len(params)
