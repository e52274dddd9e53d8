"""Re-shard a data-parallel job in the middle of an epoch without losing or repeating a sample.

Simulates a job on MNIST 5k with a global batch of 96: it starts on 1 replica, grows to 2 after 10 steps and to 4
after 10 more (as PipeTransformer's AutoDP does when freezing frees GPUs), checkpoints and resumes in the middle,
then finishes the epoch. Every replica asks the sampler for its indices of each step and advances global
progress by the global batch. At the end it checks that every sample was seen exactly once.

Run: ``python examples/data_elastic_sampler.py`` (needs ``pip install "elastic-pipe[datasets]"``).
"""

from __future__ import annotations

from collections import Counter

from elastic_pipe.data import ElasticSampler, load_mnist5k

GLOBAL_BATCH = 96
SEED = 0


def main() -> None:
    data = load_mnist5k()
    n = len(data)
    replicas = [ElasticSampler(n, 1, 0, seed=SEED)]
    seen: Counter[int] = Counter()
    step = 0
    plan = {10: 2, 20: 4}  # step -> new replica count
    while not replicas[0].exhausted:
        if step in plan:
            state = replicas[0].state_dict()  # global progress; any replica's is the same
            count = plan[step]
            replicas = [ElasticSampler(n, 1, 0, seed=SEED) for _ in range(count)]
            for rank, sampler in enumerate(replicas):
                sampler.load_state_dict(state)
                sampler.reshard(count, rank)
            print(f"step {step}: re-sharded to {count} replicas at {state['consumed']} of {n} samples")
        for sampler in replicas:
            _inputs, _labels, ids = data.batch(sampler.step_indices(GLOBAL_BATCH))  # this replica's share
            seen.update(ids.tolist())
        for sampler in replicas:
            sampler.advance(GLOBAL_BATCH)
        step += 1
    padding = replicas[0].padding_used
    repeats = sum(c - 1 for c in seen.values())
    print(f"{step} steps, {len(seen)} distinct samples of {n}, {repeats} repeats (padding positions: {padding})")
    assert len(seen) == n and repeats == padding < len(replicas)


if __name__ == "__main__":
    main()
