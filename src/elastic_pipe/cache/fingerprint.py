"""A fingerprint of the frozen prefix: what names the model whose entries a cache file holds."""

from __future__ import annotations

import hashlib
from collections.abc import Iterable

import torch

from elastic_pipe.cache.errors import CHECK

__all__ = ["prefix_fingerprint"]


def prefix_fingerprint(tensors: Iterable[torch.Tensor], config: str) -> str:
    """A hex sha256 over ``config`` and every tensor's dtype, shape and bytes, in the order given.

    Pass the frozen prefix's parameters and buffers (e.g. ``module.state_dict().values()``) and a description
    of what else decides its output (model config, input preprocessing), so that a cache built for other
    weights or another configuration is never served. The tensors are copied to the host (a device sync):
    compute it once per boundary move, not per step.

    Args:
        tensors: the prefix's tensors, in a fixed order.
        config: any text that also determines the prefix's output.

    Returns:
        64 hex characters.
    """
    tensors = CHECK.items("tensors", tensors, empty=True)
    for index, tensor in enumerate(tensors):
        CHECK.instance(f"tensors[{index}]", tensor, torch.Tensor)
    digest = hashlib.sha256()
    digest.update(len(CHECK.str("config", config).encode()).to_bytes(8, "little"))
    digest.update(config.encode())
    for tensor in tensors:
        flat = tensor.detach().to("cpu").contiguous().reshape(-1)
        # dtype and shape first: equal bytes under another dtype or shape are another tensor
        digest.update(f"{flat.dtype}{tuple(tensor.shape)}".encode())
        digest.update(flat.view(torch.uint8).numpy().tobytes() if flat.numel() else b"")
    return digest.hexdigest()
