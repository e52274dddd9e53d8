"""Serve a frozen ViT prefix from the activation cache while the rest trains, then move the boundary.

Trains the package's small ViT on 512 of scikit-learn's digits (CPU; four epochs are far too few to learn much,
the point is the cache's traffic): epoch 0 trains every block; then
the first 2 of 6 blocks freeze, epoch 1 computes their output once and caches it, epoch 2 reads it. Then 2 more
blocks freeze and the cache is extended by running only those 2 blocks on the cached values (epoch 3). Prints the
cache's counters and the measured pay-off decision.

Run: ``python examples/cache_frozen_prefix.py`` (needs ``pip install "elastic-pipe[datasets]"``);
``--storage-dtype bfloat16`` stores the entries in bfloat16 (half the bytes per entry: the tiers' lines at the end
show it; the training then reads rounded activations).
"""

from __future__ import annotations

import argparse

import torch
from torch import nn

from elastic_pipe.cache import ActivationCache, measure_payoff, parse_storage_dtype
from elastic_pipe.data import ElasticSampler, IndexedDataset, load_digits
from elastic_pipe.models import SubLayerModel, vit

BATCH = 64
LR = 1e-3
SAMPLES = 512


def train_epochs(
    model: SubLayerModel, data: IndexedDataset, frozen: int, cache: ActivationCache, *, epochs: int, first_epoch: int
) -> None:
    start = model.prefix_len(frozen)
    prefix = model.slice(0, start).eval() if frozen else None
    rest = model.slice(start, len(model))
    optimizer = torch.optim.AdamW(rest.parameters(), lr=LR)
    sampler = ElasticSampler(len(data), num_replicas=1, rank=0, seed=0)
    for epoch in range(first_epoch, first_epoch + epochs):
        sampler.set_epoch(epoch)
        total, seen = 0.0, 0
        while not sampler.exhausted:
            x, y, ids = data.batch(sampler.step_indices(BATCH))
            sampler.advance(BATCH)
            # the frozen prefix: computed on a miss, read from the cache on a hit (hits come back in the dtype the
            # cache stores them in, bfloat16 with --storage-dtype bfloat16: cast to what the next layers take)
            hidden = x if prefix is None else cache.get_or_compute(ids, frozen, x, prefix).float()
            logits = rest(hidden)
            loss = nn.functional.cross_entropy(logits, y)
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
            total += loss.detach().item() * len(y)
            seen += len(y)
        s = cache.stats
        print(f"epoch {epoch} frozen={frozen}: loss {total / seen:.3f} | cache hits {s.hits} misses {s.misses}")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--storage-dtype", default="auto", help="auto (exact), bfloat16, float16 or float32")
    args = ap.parse_args()
    model = vit("vit-tiny", seed=0)
    data = load_digits().subset(list(range(SAMPLES)))
    # a small device budget and a shared-memory tier behind it: part of the cache spills to /dev/shm
    cache = ActivationCache(
        data.num_ids, device_budget=1 << 20, host_budget=16 << 20, storage_dtype=parse_storage_dtype(args.storage_dtype)
    )
    train_epochs(model, data, 0, cache, epochs=1, first_epoch=0)
    for p in model.slice(0, model.prefix_len(2)).parameters():
        p.requires_grad_(False)
    train_epochs(model, data, 2, cache, epochs=2, first_epoch=1)

    # freeze blocks 2 and 3 as well: extend the cached entries by running only those two blocks
    extra = model.slice(model.prefix_len(2), model.prefix_len(4)).eval()
    moved = cache.extend(2, 4, lambda v: extra(v.float()))  # the stored entries, widened for the blocks
    print(f"extended {moved} entries from boundary 2 to 4; boundaries now {cache.boundaries()}")
    for p in extra.parameters():
        p.requires_grad_(False)
    train_epochs(model, data, 4, cache, epochs=1, first_epoch=3)

    x, _, ids = data.batch(list(range(BATCH)))
    decision = measure_payoff(cache, ids, 4, x, model.slice(0, model.prefix_len(4)).eval())
    print(decision.reason)
    for tier in cache.stats.tiers:
        print(f"  {tier.name}: {tier.entries} entries, {tier.used_bytes} of {tier.budget_bytes} bytes")
    cache.unlink()


if __name__ == "__main__":
    main()
