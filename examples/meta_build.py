"""Build a model without its weights and materialize only one stage's sub-layers, as each rank of a run does.

Run: ``python examples/meta_build.py``. The values a rank gets equal the whole model's (per-sub-layer seeds), so no
rank ever needs the sub-layers it does not run (docs/training.md, "Stage residency").
"""

from __future__ import annotations

import torch

from elastic_pipe.models import vit
from elastic_pipe.models.weights import materialize_sublayers


def resident_bytes(model: torch.nn.Module) -> int:
    """Bytes of parameters with real storage (meta tensors take none)."""
    return sum(p.numel() * p.element_size() for p in model.parameters() if not p.is_meta)


def main() -> None:
    whole = vit("vit-tiny", seed=0, depth=8)
    lazy = vit("vit-tiny", seed=0, depth=8, meta=True)
    print(f"whole model: {resident_bytes(whole) / 2**20:.2f} MiB; built on meta: {resident_bytes(lazy)} bytes")
    stage = range(5, 10)  # the sub-layers one rank of a 4-stage pipeline might hold
    materialize_sublayers(lazy, stage)
    print(f"after materializing sub-layers {list(stage)}: {resident_bytes(lazy) / 2**20:.2f} MiB")
    pairs = [pq for j in stage for pq in zip(lazy[j].parameters(), whole[j].parameters(), strict=True)]
    same = all(torch.equal(p, q) for p, q in pairs)
    print(f"their values equal the whole model's: {same}")


if __name__ == "__main__":
    main()
