"""The run's activation cache: its tiers from ``[pipeline]``, built on every rank at the start and released at the
end (filling and carrying it: :mod:`~elastic_pipe.orchestrator.prefix.fill`).

The tiers (``[pipeline] cache_tiers``): device memory per rank, then host memory per node (``/dev/shm`` files that
the node's stage-0 ranks share, or pinned memory per rank), then a disk directory per node; every rank of a node
uses one cache name (broadcast from rank 0) and local rank 0 is the leader that deletes the node's files.
"""

from __future__ import annotations

import uuid
from collections.abc import Callable
from typing import TYPE_CHECKING

import torch

from elastic_pipe import cache as acache

if TYPE_CHECKING:
    from elastic_pipe.orchestrator.config import PipelineSection, TrainConfig

__all__: list[str] = []  # internal: the package face exports what others use

#: Bytes per MiB (``[pipeline] cache_mb``).
MIB = 1 << 20
#: The budget of a disk tier given without ``disk_size``: more than any cache needs, so its segments are sized to
#: their entries and only the file system's free space limits them.
UNBOUNDED_DISK = 1 << 62


def cache_tiers(pipeline: PipelineSection) -> acache.CacheTiers:
    """The tiers ``[pipeline]`` describes: ``cache_tiers`` (already validated, sizes in bytes), the device tier
    from ``cache_mb`` unless ``cache_tiers.device`` is given; a disk tier without ``disk_size`` may grow to what
    the cache needs (a full file system then leaves the rest uncached)."""
    t = pipeline.cache_tiers
    disk = str(t.get("disk", ""))
    return acache.CacheTiers(
        device_bytes=int(t.get("device", pipeline.cache_mb * MIB)),
        host_bytes=int(t.get("host", 0)),
        disk_dir=disk,
        disk_bytes=int(t.get("disk_size", 0)) or (UNBOUNDED_DISK if disk else 0),
        host_kind=acache.HostKind(t.get("host_kind", "shared")),
        host_dir=str(t.get("host_dir", "")),
    )


def build_cache(
    config: TrainConfig,
    *,
    rank: int,
    device: torch.device,
    num_samples: int,
    random_transforms: bool,
    broadcast: Callable[[bytes | None, int], bytes],
) -> acache.ActivationCache | None:
    """Every rank's cache for the run, ``None`` with ``[pipeline] cache = "off"`` (a collective on the control
    group: rank 0 names the cache).

    The ranks of a node share one name, so a ``/dev/shm`` host tier and the disk tier hold each entry once per
    node; local rank 0 is the node's leader (it deletes the node's files). The name carries the node's index, so
    nodes that share a disk directory do not share files. ``[pipeline] cache_dtype`` is the dtype every tier
    stores the entries in (``"auto"``: the prefix output's own).

    Raises:
        CacheDirError: the disk (or shared host) directory cannot be created or written.
    """
    p = config.pipeline
    if p.cache == "off":
        return None
    token = broadcast(uuid.uuid4().hex[:12].encode() if rank == 0 else None, 0).decode()
    local, node = rank % config.launch.nproc_per_node, rank // config.launch.nproc_per_node
    policy = p.cache_policy if random_transforms else "error"
    return acache.ActivationCache.from_tiers(
        num_samples,
        cache_tiers(p),
        device=device,
        name=f"elastic_pipe-{token}-n{node}",
        leader=local == 0,
        augmentation="random" if random_transforms else "none",
        on_random_augmentation=policy,
        views=p.views if random_transforms and policy == "views" else 1,
        storage_dtype=acache.parse_storage_dtype(p.cache_dtype),
    )


def release_cache(cache: acache.ActivationCache) -> None:
    """At the run's end: the leader deletes the node's shared files (nobody can reuse a run's random name), the
    others let go of their handles."""
    if cache.config.leader:
        cache.unlink()
    else:
        cache.close()
