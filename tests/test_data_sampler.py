"""ElasticSampler: exact shards, determinism, resume, and exactly-once over random sequences of re-shards."""

from __future__ import annotations

from collections import Counter

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from elastic_pipe.data import DataError, ElasticSampler


def test_exact_shards_with_padding() -> None:
    shards = [list(ElasticSampler(10, 3, r, shuffle=False)) for r in range(3)]
    # positions 10 and 11 are padding: they repeat order[0] and order[1]
    assert shards == [[0, 3, 6, 9], [1, 4, 7, 0], [2, 5, 8, 1]]


def test_exact_shards_with_drop_last() -> None:
    shards = [list(ElasticSampler(10, 3, r, shuffle=False, drop_last=True)) for r in range(3)]
    assert shards == [[0, 3, 6], [1, 4, 7], [2, 5, 8]]


def test_order_is_a_deterministic_permutation_per_seed_and_epoch() -> None:
    a, b = ElasticSampler(100, 2, 0, seed=7), ElasticSampler(100, 4, 3, seed=7)
    assert a.epoch_order() == b.epoch_order()
    assert sorted(a.epoch_order()) == list(range(100))
    first = a.epoch_order()
    a.set_epoch(1)
    assert a.epoch_order() != first
    assert a.epoch_order() != ElasticSampler(100, 1, 0, seed=8).epoch_order()
    a.set_epoch(0)
    assert a.epoch_order() == first


def test_reshard_mid_epoch_splits_the_rest() -> None:
    s = ElasticSampler(10, 3, 1, shuffle=False)
    assert s.step_indices(6) == [1, 4]
    assert s.advance(6) == 6
    s.reshard(2, 1)
    assert list(s) == [7, 9]
    s.reshard(2, 0)
    assert list(s) == [6, 8]
    assert s.advance(4) == 4
    assert s.exhausted and s.padding_used == 0


def test_last_step_is_short_and_equal_and_advance_clamps() -> None:
    s = ElasticSampler(7, 2, 0, shuffle=False)
    s.advance(4)
    assert s.step_indices(4) == [4, 6]
    assert ElasticSampler(7, 2, 1, shuffle=False).step_indices(4) == [1, 3]
    assert s.advance(4) == 4  # 3 real positions + 1 padding
    assert s.padding_used == 1 and s.exhausted
    assert s.advance(4) == 0


def test_set_epoch_keeps_progress_of_the_current_epoch() -> None:
    s = ElasticSampler(20, 2, 0)
    s.advance(6)
    s.set_epoch(0)
    assert s.consumed == 6
    s.set_epoch(1)
    assert (s.epoch, s.consumed) == (1, 0)


def test_state_dict_resumes_on_another_replica_count() -> None:
    s = ElasticSampler(50, 4, 2, seed=3)
    s.set_epoch(5)
    s.advance(20)
    state = s.state_dict()
    resumed = [ElasticSampler(50, 3, r, seed=3) for r in range(3)]
    for r in resumed:
        r.load_state_dict(state)
    rest = sorted(i for r in resumed for i in r)
    order = s.epoch_order()
    assert order == resumed[0].epoch_order()
    # 30 positions left over 3 replicas: exactly the rest of the order, no padding
    assert rest == sorted(order[20:])


def test_dataloader_drives_the_sampler() -> None:
    data = torch.arange(12) * 10
    s = ElasticSampler(12, 2, 1, shuffle=False)
    loader = torch.utils.data.DataLoader(data, batch_size=3, sampler=s)
    assert [b.tolist() for b in loader] == [[10, 30, 50], [70, 90, 110]]


@pytest.mark.parametrize(
    ("kwargs", "match"),
    [
        ({"num_samples": 0, "num_replicas": 1, "rank": 0}, "num_samples"),
        ({"num_samples": 5, "num_replicas": 0, "rank": 0}, "num_replicas"),
        ({"num_samples": 5, "num_replicas": 2, "rank": 2}, r"rank must lie in \[0, 2\), got 2"),
        ({"num_samples": 5, "num_replicas": 2, "rank": 0, "seed": -1}, "seed"),
    ],
)
def test_bad_construction(kwargs: dict[str, int], match: str) -> None:
    with pytest.raises(DataError, match=match):
        ElasticSampler(**kwargs)


def test_bad_calls() -> None:
    s = ElasticSampler(10, 4, 0)
    with pytest.raises(DataError, match="multiple of num_replicas=4, got 6"):
        s.step_indices(6)
    with pytest.raises(DataError, match="n >= 0"):
        s.advance(-1)
    with pytest.raises(DataError, match="epoch"):
        s.set_epoch(-1)
    with pytest.raises(DataError, match="rank"):
        s.reshard(2, 5)
    with pytest.raises(DataError, match="this sampler is"):
        s.load_state_dict(ElasticSampler(11, 1, 0).state_dict())
    with pytest.raises(DataError, match="version 9"):
        s.load_state_dict({**s.state_dict(), "version": 9})
    with pytest.raises(DataError, match="not an ElasticSampler state"):
        s.load_state_dict({"epoch": 1})


phases = st.lists(
    st.tuples(st.integers(1, 6), st.integers(1, 5), st.integers(0, 4)),  # replicas, per-replica batch, steps
    min_size=1,
    max_size=5,
)


@settings(max_examples=60, deadline=None)
@given(
    num_samples=st.integers(1, 80),
    phases=phases,
    drop_last=st.booleans(),
    seed=st.integers(0, 3),
    checkpoint=st.booleans(),
)
def test_every_sample_exactly_once_over_any_reshards(
    num_samples: int, phases: list[tuple[int, int, int]], drop_last: bool, seed: int, checkpoint: bool
) -> None:
    """Each phase re-shards to R replicas and runs steps of B = R * b; the last phase runs to the epoch's end.

    Exactly once: every sample appears once among the real positions; with padding, the extra yields are the
    first P < R_end samples of the order (R_end: the replica count of the step that reached the end of the
    epoch); with drop_last, the missing ones are the last D < R_final of the order.
    """
    state = ElasticSampler(num_samples, 1, 0, seed=seed, drop_last=drop_last).state_dict()
    seen: list[int] = []
    final_replicas = 0  # the replica count of the last step (the one that reached the epoch's end)
    for number, (replicas, per_replica, steps) in enumerate(phases):
        last = number == len(phases) - 1
        samplers = [ElasticSampler(num_samples, 1, 0, seed=seed, drop_last=drop_last) for _ in range(replicas)]
        for rank, sampler in enumerate(samplers):
            sampler.load_state_dict(state)
            sampler.reshard(replicas, rank)
        step = 0
        while not samplers[0].exhausted and (last or step < steps):
            batches = [s.step_indices(replicas * per_replica) for s in samplers]
            assert len({len(b) for b in batches}) == 1  # equal shards, also on the short last step
            seen.extend(i for b in batches for i in b)
            for s in samplers:
                s.advance(replicas * per_replica)
            step += 1
            final_replicas = replicas
        assert len({s.consumed for s in samplers}) == 1
        state = samplers[0].state_dict() if checkpoint else samplers[-1].state_dict()
    order = ElasticSampler(num_samples, 1, 0, seed=seed).epoch_order()
    extra = Counter(seen) - Counter(range(num_samples))
    missing = Counter(range(num_samples)) - Counter(seen)
    if drop_last:  # the final phase ran until fewer than its R samples were left
        assert not extra
        assert len(missing) < phases[-1][0]
        assert set(missing) == set(order[num_samples - len(missing) :])
    else:
        assert not missing
        padding = sum(extra.values())
        assert padding < final_replicas
        assert extra == Counter(order[i % num_samples] for i in range(padding))
