"""Create every process group a run can need, once, up front; broadcast control messages with real timeouts.

``torch.distributed.new_group`` is collective: every rank of the world must call it, for every group, in the same
order, even for groups it is not a member of. Creating groups lazily in the middle of training (when a transition
happens to need a new pipeline length) is how peers end up waiting for each other forever. So
:meth:`GroupManager.build` creates, at start-up and in one fixed order on every rank:

1. one static control group over all ranks, always on gloo (small CPU messages: transitions, barriers);
2. for every reachable pipeline length, in decreasing order, the SPMD pipeline groups (one per replica) and then
   the data-parallel groups (one per stage), on the training backend (NCCL on GPU, gloo on CPU).

Every group gets the configured timeout, so a dead or silent peer surfaces as a :class:`GroupsError` after that
many seconds instead of a hang. :meth:`GroupManager.destroy` tears them all down at shutdown.
"""

from __future__ import annotations

import datetime
import logging
import re
from collections.abc import Iterable
from types import TracebackType
from typing import Any

import torch
import torch.distributed as dist

from elastic_pipe.groups.errors import CHECK, BarrierTimeoutError, GroupsError
from elastic_pipe.groups.spmd import MAX_WORLD_SIZE, RankPlan, plan_spmd

__all__ = ["CONTROL_BACKEND", "MAX_BROADCAST_BYTES", "GroupManager", "silent_ranks"]

#: gloo's monitored barrier names the ranks that did not arrive: "Ranks 1, 3 failed to pass monitoredBarrier ...".
_SILENT = re.compile(r"Ranks? ([\d, ]+) failed to pass monitoredBarrier")


def silent_ranks(message: str) -> tuple[int, ...]:
    """The ranks a monitored barrier's error names as not arrived (empty when it names none)."""
    found = _SILENT.search(CHECK.str("message", message))
    return () if found is None else tuple(int(r) for r in found.group(1).replace(",", " ").split())


log = logging.getLogger(__name__)

#: The control group always runs on gloo: its messages are small CPU tensors and gloo supports monitored barriers.
CONTROL_BACKEND = "gloo"
#: Largest payload :meth:`GroupManager.broadcast_bytes` accepts or allocates (a transition message is ~100 bytes).
MAX_BROADCAST_BYTES = 64 << 20


class GroupManager:
    """The control group and the cached training groups of one rank.

    The constructor only validates and stores its arguments; :meth:`build` touches ``torch.distributed`` (the
    default process group must already be initialized).

    Args:
        world_size: number of processes, one per device.
        rank: this process's rank.
        pipe_lens: every pipeline length the run can reach (e.g. 8, 4, 2, 1); each must divide ``world_size``.
        backend: backend of the training groups, e.g. ``"nccl"`` on GPU, ``"gloo"`` on CPU.
        gpus_per_node: devices per node, checked by :func:`plan_spmd` to keep pipelines inside a node.
        timeout: seconds any collective on these groups may wait before it fails.

    Raises:
        GroupsError: invalid arguments.

    Example::

        manager = GroupManager(world_size, rank, pipe_lens=(4, 2, 1), backend="gloo", timeout=30.0)
        manager.build()
        try:
            payload = manager.broadcast_bytes(encode(msg) if rank == 0 else None, src=0)
            group = manager.dp_group(decode(payload).pipe_len)
        finally:
            manager.destroy()
    """

    def __init__(
        self,
        world_size: int,
        rank: int,
        pipe_lens: Iterable[int],
        *,
        backend: str,
        gpus_per_node: int | None = None,
        timeout: float = 60.0,
    ) -> None:
        lens = tuple(CHECK.ints("pipe_lens", pipe_lens, lo=1, hi=MAX_WORLD_SIZE, empty=True))
        if not lens:
            raise GroupsError("pipe_lens must name at least one pipeline length")
        # One plan per length validates each length against the world size before anything is created. Sorting
        # makes the creation order identical on every rank even if ranks pass the lengths in different orders.
        plans = {k: plan_spmd(world_size, k, gpus_per_node) for k in lens}
        self._plans: dict[int, RankPlan] = {k: plans[k] for k in sorted(plans, reverse=True)}
        if not 0 <= CHECK.int("rank", rank) < world_size:
            raise GroupsError(f"rank must be in [0, {world_size}), got {rank!r}")
        if not CHECK.str("backend", backend):
            raise GroupsError(f"backend must be a backend name such as 'nccl' or 'gloo', got {backend!r}")
        if not CHECK.float("timeout", timeout, finite=False) > 0:
            raise GroupsError(f"timeout must be a number of seconds > 0, got {timeout!r}")
        self.world_size = world_size
        self.rank = rank
        self.backend = backend
        self.gpus_per_node = gpus_per_node
        self.timeout = float(timeout)
        self._control: Any = None
        self._pipeline: dict[int, Any] = {}
        self._dp: dict[int, Any] = {}
        self._owned: list[Any] = []

    @property
    def pipe_lens(self) -> tuple[int, ...]:
        """The pipeline lengths this manager serves, in creation order (decreasing)."""
        return tuple(self._plans)

    @property
    def built(self) -> bool:
        """Whether :meth:`build` has run and :meth:`destroy` has not."""
        return self._control is not None

    def plan(self, pipe_len: int) -> RankPlan:
        """The SPMD plan for ``pipe_len`` (one of :attr:`pipe_lens`)."""
        try:
            return self._plans[pipe_len]
        except KeyError:
            raise GroupsError(f"pipe_len {pipe_len!r} is not one of this manager's {list(self._plans)}") from None

    def _timedelta(self) -> datetime.timedelta:
        return datetime.timedelta(seconds=self.timeout)

    def _new_group(self, ranks: tuple[int, ...], backend: str) -> Any:
        try:
            group = dist.new_group(ranks=list(ranks), timeout=self._timedelta(), backend=backend)
        except RuntimeError as exc:
            raise GroupsError(
                f"rank {self.rank}: creating the {backend} group {list(ranks)} failed within {self.timeout:g} s "
                f"(is every rank calling build() with the same pipe_lens?): {exc}"
            ) from exc
        if self.rank in ranks:
            self._owned.append(group)
        return group

    def build(self) -> None:
        """Create the control group and every training group, in the same order on every rank (collective).

        All or nothing: if any group cannot be created, those already created are destroyed before the error.

        Raises:
            GroupsError: ``torch.distributed`` is not initialized, disagrees with this manager's world size or
                rank, the manager is already built, or a group could not be created within the timeout.
        """
        if self.built:
            raise GroupsError("build() was already called; call destroy() first")
        if not dist.is_available() or not dist.is_initialized():
            raise GroupsError("torch.distributed is not initialized; call init_process_group before build()")
        if dist.get_world_size() != self.world_size or dist.get_rank() != self.rank:
            raise GroupsError(
                f"torch.distributed has world size {dist.get_world_size()} and rank {dist.get_rank()}, "
                f"but this manager was made for world size {self.world_size} and rank {self.rank}"
            )
        try:
            self._control = self._new_group(tuple(range(self.world_size)), CONTROL_BACKEND)
            for k, plan in self._plans.items():
                for ranks in plan.pipeline_groups:
                    group = self._new_group(ranks, self.backend)
                    if self.rank in ranks:
                        self._pipeline[k] = group
                for ranks in plan.dp_groups:
                    group = self._new_group(ranks, self.backend)
                    if self.rank in ranks:
                        self._dp[k] = group
        except BaseException:
            self.destroy()  # all or nothing: a half-built manager would leak the groups it did create
            raise
        log.info(
            "rank %d: built control group and %d training groups for pipe_lens %s",
            self.rank,
            sum(p.replicas + p.pipe_len for p in self._plans.values()),
            list(self._plans),
        )

    def _require_built(self) -> None:
        if not self.built:
            raise GroupsError("the groups are not built; call build() first (on every rank)")

    @property
    def control_group(self) -> Any:
        """The static gloo control group over all ranks."""
        self._require_built()
        return self._control

    def pipeline_group(self, pipe_len: int) -> Any:
        """This rank's pipeline group (its replica's ranks) at ``pipe_len``."""
        self._require_built()
        self.plan(pipe_len)
        return self._pipeline[pipe_len]

    def dp_group(self, pipe_len: int) -> Any:
        """This rank's data-parallel group (the same stage in every replica) at ``pipe_len``."""
        self._require_built()
        self.plan(pipe_len)
        return self._dp[pipe_len]

    def _collective(self, what: str, fn: Any, *args: Any, **kwargs: Any) -> None:
        try:
            fn(*args, **kwargs)
        except RuntimeError as exc:
            raise GroupsError(
                f"rank {self.rank}: {what} did not complete within {self.timeout:g} s (a peer is dead, silent, or "
                f"not making the same call): {' '.join(str(exc).split())}"
            ) from exc

    def broadcast_bytes(self, payload: bytes | None, src: int = 0) -> bytes:
        """Send ``payload`` from rank ``src`` to every rank over the control group (collective).

        The length goes first as an int64 tensor, then the bytes as a uint8 tensor, so receivers allocate exactly
        what was sent (bounded by :data:`MAX_BROADCAST_BYTES`). Nothing is pickled.

        Args:
            payload: the bytes on ``src``; ignored (pass None) on the other ranks.
            src: the sending rank.

        Returns:
            The payload, on every rank.

        Raises:
            GroupsError: not built, a bad ``src`` or payload, or the broadcast timed out.
        """
        self._require_built()
        if not isinstance(src, int) or not 0 <= src < self.world_size:
            raise GroupsError(f"src must be a rank in [0, {self.world_size}), got {src!r}")
        length = torch.zeros(1, dtype=torch.int64)
        if self.rank == src:
            if not isinstance(payload, bytes | bytearray | memoryview):
                raise GroupsError(f"rank {src} sends, so its payload must be bytes, got {type(payload).__name__}")
            data = bytes(payload)
            if len(data) > MAX_BROADCAST_BYTES:
                raise GroupsError(f"payload of {len(data)} bytes exceeds MAX_BROADCAST_BYTES={MAX_BROADCAST_BYTES}")
            length[0] = len(data)
        what = f"broadcast from rank {src} over the control group"
        self._collective(what, dist.broadcast, length, src=src, group=self._control)
        n = int(length.item())
        if not 0 <= n <= MAX_BROADCAST_BYTES:
            raise GroupsError(f"rank {src} announced {n} bytes, outside [0, {MAX_BROADCAST_BYTES}]")
        if n == 0:
            return b""
        if self.rank == src:
            buffer = torch.frombuffer(bytearray(data), dtype=torch.uint8)
        else:
            buffer = torch.empty(n, dtype=torch.uint8)
        self._collective(what, dist.broadcast, buffer, src=src, group=self._control)
        return buffer.numpy().tobytes()

    def barrier(self) -> None:
        """Wait until every rank reaches this point, over the control group (collective).

        Uses gloo's monitored barrier, so the failure on rank 0 names the ranks that did not arrive.

        Raises:
            BarrierTimeoutError: some rank did not arrive within the timeout (``silent`` names it, on rank 0).
        """
        self._require_built()
        try:
            self._collective(
                "barrier on the control group",
                dist.monitored_barrier,
                group=self._control,
                timeout=self._timedelta(),
                wait_all_ranks=True,
            )
        except GroupsError as exc:
            cause = exc.__cause__
            raise BarrierTimeoutError(str(exc), silent_ranks(str(cause) if cause else str(exc))) from cause

    def destroy(self) -> None:
        """Destroy every group this rank created (safe to call twice, and after a failed build)."""
        for group in reversed(self._owned):
            try:
                dist.destroy_process_group(group)
            except (RuntimeError, ValueError) as exc:  # already gone with the default group
                log.debug("rank %d: destroying a group failed: %s", self.rank, exc)
        self._owned.clear()
        self._pipeline.clear()
        self._dp.clear()
        self._control = None

    def __enter__(self) -> GroupManager:
        self.build()
        return self

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.destroy()
