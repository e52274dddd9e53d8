"""Checkpoint integrity: the checksums of a checkpoint's manifest and the checks a loaded state must pass.

Pure functions over a state (nested dicts and lists of tensors and plain data) and over bytes on disk;
:mod:`.files` writes the files and :mod:`.loads` reads them, and they call them.

Two layers of checksums, because they catch different faults: the SHA-256 of the whole file catches a torn,
truncated or bit-flipped file before it is unpickled; the CRC-32 of each tensor's bytes, taken from the state in
memory before it was serialised, catches a file that is intact on disk but does not hold what was meant to be
saved (a serialisation bug, a file swapped under a manifest). A checkpoint that passes both may still hold a
diverged run's weights, so floating-point tensors must also be finite and within :data:`MAX_ABS`.
"""

from __future__ import annotations

import hashlib
import math
import zlib
from collections.abc import Iterator, Mapping
from pathlib import Path

import torch

__all__ = ["MAX_ABS", "file_sha256", "tensor_checksums", "tensors", "value_problems", "verify_tensors"]

#: Largest magnitude a saved floating-point value may have. Trained weights and optimizer moments sit many orders
#: of magnitude below it; a flipped exponent bit in a float32 gives values like -2.99e36, far above it.
MAX_ABS = 1e30
#: Bytes read at a time while hashing a file.
_CHUNK = 1 << 20


def tensors(state: object, prefix: str = "") -> Iterator[tuple[str, torch.Tensor]]:
    """Every tensor in a nested state with its path (``"model/embed.weight"``, ``"optimizer/state/w/exp_avg"``)."""
    if isinstance(state, torch.Tensor):
        yield prefix, state
    elif isinstance(state, dict):
        for key, value in state.items():
            yield from tensors(value, f"{prefix}/{key}" if prefix else str(key))
    elif isinstance(state, list | tuple):
        for i, value in enumerate(state):
            yield from tensors(value, f"{prefix}/{i}" if prefix else str(i))


def _crc32(t: torch.Tensor) -> int:
    raw = t.detach().cpu().contiguous().reshape(-1).view(torch.uint8)
    return zlib.crc32(raw.numpy().tobytes())


def tensor_checksums(state: object, prefix: str = "") -> dict[str, int]:
    """CRC-32 of every tensor's bytes, by path (under ``prefix``)."""
    return {path: _crc32(t) for path, t in tensors(state, prefix)}


def file_sha256(path: str | Path) -> str:
    """Hex SHA-256 of a file's bytes."""
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        while chunk := f.read(_CHUNK):
            digest.update(chunk)
    return digest.hexdigest()


def verify_tensors(state: object, expected: Mapping[str, int]) -> list[str]:
    """What differs between a loaded state's tensors and the manifest's CRC-32s (empty when they agree)."""
    actual = tensor_checksums(state)
    problems = [f"tensor {p!r} is missing" for p in expected if p not in actual]
    problems += [f"tensor {p!r} is not in the manifest" for p in actual if p not in expected]
    problems += [f"tensor {p!r} fails its CRC-32" for p, crc in actual.items() if p in expected and expected[p] != crc]
    return problems


def value_problems(state: object, max_abs: float = MAX_ABS) -> list[str]:
    """Floating-point tensors holding a NaN, an infinity or a magnitude above ``max_abs`` (empty when none)."""
    problems = []
    for path, t in tensors(state):
        if not (t.is_floating_point() or t.is_complex()) or t.numel() == 0:
            continue
        finite = torch.isfinite(t)
        if not bool(finite.all()):
            problems.append(f"tensor {path!r} holds {int((~finite).sum())} non-finite values")
            continue
        peak = float(t.detach().abs().max())
        if not math.isfinite(peak) or peak > max_abs:
            problems.append(f"tensor {path!r} holds a value of magnitude {peak:.3g} > {max_abs:g}")
    return problems
