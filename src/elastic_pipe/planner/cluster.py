"""The cluster a plan runs on: GPUs, nodes, memory, speeds and links.

Defaults describe one H200 (torch 2.11, bf16 autocast, eager): the compute rates are *achieved* rates, fitted so
that the analytic ViT-B/16 sub-layer times match ones timed on that GPU, not datasheet peaks; docs/planner.md
("Calibration") compares them with the measurements. The fixed per-step host costs (``data_overhead``,
``pass_overhead``, the optimizer's and the gradient sync's floors and per-sub-layer costs) are the package's
orchestrator measured on the same machine
(``benchmarks/results/gpu_2xh200_vit_session1.json``: ViT-B/16, 2 GPUs, DDP, batch 512, phase times per step).
Numbers that were not measured here are marked as assumptions.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

from elastic_pipe.planner.errors import CHECK, PlannerError
from elastic_pipe.types import MAX_BYTES

__all__ = ["H200", "MAX_GPUS", "ClusterSpec", "GpuSpec"]

_GIB = 1024**3


#: The most GPUs a cluster has: past the largest published training runs (~16k GPUs); the planner prices layouts
#: per divisor of the GPU count, so this also bounds its time.
MAX_GPUS = 65_536


def _check_positive(owner: str, **values: float) -> None:
    for key, value in values.items():
        if not (math.isfinite(CHECK.number(f"{owner}.{key}", value)) and value > 0):
            raise PlannerError(f"{owner}.{key} must be a finite number > 0, got {value!r}")


def _check_non_negative(owner: str, **values: float) -> None:
    for key, value in values.items():
        if not (math.isfinite(CHECK.number(f"{owner}.{key}", value)) and value >= 0):
            raise PlannerError(f"{owner}.{key} must be a finite number >= 0, got {value!r}")


@dataclass(frozen=True, slots=True)
class GpuSpec:
    """One accelerator.

    Attributes:
        name: a label.
        memory: bytes of device memory.
        reserved_memory: bytes the plan never uses (CUDA context, allocator fragmentation, workspaces).
        matmul_flops: achieved dense 16-bit matrix-multiply FLOP/s. H200: ViT-B/16's MLP sub-layer at batch 256
            runs 1.23 ms forward; its 476 GFLOP minus the element-wise time give 4.9e14.
        attention_flops: achieved FLOP/s of the fused attention core (head size 64, 197 tokens): 1.3e14 on H200,
            fitted from the attention sub-layer's 0.97 ms.
        conv_flops: achieved FLOP/s of the ViT patch-embedding convolution: 2.5e13 on H200 (2.47 ms measured).
        memory_bandwidth: achieved bytes/s of element-wise kernels (assumption: 4.0e12, ~83% of H200's 4.8 TB/s).
        host_overhead: eager host time per transformer block per micro-batch and pass (s). Measured ~1 ms; 0 when
            the step is captured in a CUDA graph or compiled.
        data_overhead: host time per optimizer step to draw the step's sample indices, gather the batch and launch
            its copy to the device (s). The orchestrator's data phase measured 0.35-0.45 ms in every arm and
            layout; it is not overlapped because each phase starts from a synchronised device.
        pass_overhead: host time per optimizer step that the pipeline runtime spends outside the layers while the
            device waits: splitting the batch, the loss, starting autograd's backward (s). Measured ~1 ms: a step
            whose only trained sub-layer is the head reads its cached input and runs forward+backward in 2.0-2.2
            ms, where the head's own eager work is 1.0 ms.
        optimizer_overhead: the optimizer phase's floor per step (s): the learning-rate scheduler, ``zero_grad``
            and the optimizer's own bookkeeping. Least-squares intercept of the measured optimizer phase against
            the trained sub-layer count: 0.48 ms (rounded to 0.5).
        optimizer_sublayer_overhead: optimizer time per trained sub-layer beyond moving its bytes (s):
            ``torch.optim.AdamW`` (foreach, the orchestrator's default) loops over each parameter tensor in
            Python and runs unfused passes (~6 tensors per transformer sub-layer). Least-squares slope: 0.136 ms.
    """

    name: str = "h200"
    memory: int = 141 * 10**9
    reserved_memory: int = 2 * _GIB
    matmul_flops: float = 4.9e14
    attention_flops: float = 1.3e14
    conv_flops: float = 2.5e13
    memory_bandwidth: float = 4.0e12
    host_overhead: float = 1.0e-3
    data_overhead: float = 0.4e-3
    pass_overhead: float = 1.0e-3
    optimizer_overhead: float = 0.5e-3
    optimizer_sublayer_overhead: float = 0.135e-3

    def __post_init__(self) -> None:
        CHECK.str("GpuSpec.name", self.name)
        CHECK.int("GpuSpec.memory", self.memory, hi=MAX_BYTES)
        CHECK.int("GpuSpec.reserved_memory", self.reserved_memory, hi=MAX_BYTES)
        _check_positive(
            "GpuSpec",
            memory=self.memory,
            matmul_flops=self.matmul_flops,
            attention_flops=self.attention_flops,
            conv_flops=self.conv_flops,
            memory_bandwidth=self.memory_bandwidth,
        )
        _check_non_negative(
            "GpuSpec",
            reserved_memory=self.reserved_memory,
            host_overhead=self.host_overhead,
            data_overhead=self.data_overhead,
            pass_overhead=self.pass_overhead,
            optimizer_overhead=self.optimizer_overhead,
            optimizer_sublayer_overhead=self.optimizer_sublayer_overhead,
        )
        if self.reserved_memory >= self.memory:
            raise PlannerError(f"GpuSpec.reserved_memory={self.reserved_memory} must be below memory={self.memory}")

    @property
    def usable_memory(self) -> int:
        """Bytes a stage may fill: memory minus the reserve."""
        return self.memory - self.reserved_memory


#: The measured H200 (the defaults of :class:`GpuSpec`).
H200 = GpuSpec()


@dataclass(frozen=True, slots=True)
class ClusterSpec:
    """A homogeneous cluster.

    Attributes:
        gpus: GPU count W.
        gpus_per_node: GPUs sharing a node (NVLink island, host memory).
        gpu: the accelerator.
        intra_node_bandwidth: point-to-point and ring bandwidth inside a node, bytes/s (NVLink; measured 348 GB/s
            send/recv at 256 MB and an all-reduce bus rate of 281 GB/s; 3.0e11 is between).
        inter_node_bandwidth: per-GPU bandwidth between nodes, bytes/s (assumption: 5.0e10, one 400 Gb/s NIC per GPU).
        p2p_latency: fixed cost of one point-to-point message (s); measured ~45 us floor.
        collective_latency: fixed cost of one ring step of a collective (s) (assumption: 5 us).
        sync_overhead: fixed cost per step of averaging gradients over more than one replica (s): launching the
            first collective, waiting for the slowest replica, synchronising the device. Least-squares intercept
            of the orchestrator's measured gradient-sync phase (minus the ring's bandwidth time) against the
            trained sub-layer count on the rank: 0.65 ms.
        sync_sublayer_overhead: gradient-sync time per trained sub-layer on the rank (s): its ~6 gradients are
            flattened into a 25 MiB bucket and the averaged values copied back tensor by tensor, each a few small
            kernels issued from Python. Least-squares slope: 0.20 ms.
        host_bandwidth: pinned host -> device copy rate per GPU, bytes/s (measured 55 GB/s).
        host_cache_memory: host memory per node that an activation cache may use, bytes (assumption: 1 TiB of a
            2 TiB node).
        disk_bandwidth: per-GPU read rate of the disk cache tier, bytes/s (assumption: 5 GB/s local NVMe).
        gpu_cache_bandwidth: read rate of a cache held in device memory (measured: 77.5 MB in 0.04 ms).
    """

    gpus: int
    gpus_per_node: int = 8
    gpu: GpuSpec = field(default_factory=GpuSpec)
    intra_node_bandwidth: float = 3.0e11
    inter_node_bandwidth: float = 5.0e10
    p2p_latency: float = 45e-6
    collective_latency: float = 5e-6
    sync_overhead: float = 0.65e-3
    sync_sublayer_overhead: float = 0.2e-3
    host_bandwidth: float = 5.5e10
    host_cache_memory: int = 1024 * _GIB
    disk_bandwidth: float = 5.0e9
    gpu_cache_bandwidth: float = 1.9e12

    def __post_init__(self) -> None:
        CHECK.int("ClusterSpec.gpus", self.gpus, lo=1, hi=MAX_GPUS)
        CHECK.int("ClusterSpec.gpus_per_node", self.gpus_per_node, lo=1, hi=MAX_GPUS)
        CHECK.instance("ClusterSpec.gpu", self.gpu, GpuSpec)
        CHECK.int("ClusterSpec.host_cache_memory", self.host_cache_memory, hi=MAX_BYTES)
        if self.gpus > self.gpus_per_node and self.gpus % self.gpus_per_node:
            raise PlannerError(
                f"ClusterSpec.gpus={self.gpus} must be a multiple of gpus_per_node={self.gpus_per_node} "
                "when it spans several nodes"
            )
        _check_positive(
            "ClusterSpec",
            intra_node_bandwidth=self.intra_node_bandwidth,
            inter_node_bandwidth=self.inter_node_bandwidth,
            host_bandwidth=self.host_bandwidth,
            disk_bandwidth=self.disk_bandwidth,
            gpu_cache_bandwidth=self.gpu_cache_bandwidth,
        )
        _check_non_negative(
            "ClusterSpec",
            p2p_latency=self.p2p_latency,
            collective_latency=self.collective_latency,
            sync_overhead=self.sync_overhead,
            sync_sublayer_overhead=self.sync_sublayer_overhead,
            host_cache_memory=self.host_cache_memory,
        )

    @property
    def nodes(self) -> int:
        """Number of nodes."""
        return max(1, self.gpus // self.gpus_per_node)

    @property
    def gpus_on_a_node(self) -> int:
        """GPUs that actually share one node (fewer than ``gpus_per_node`` on a partial single node)."""
        return min(self.gpus, self.gpus_per_node)
