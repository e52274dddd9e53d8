"""elastic_pipe.groups: the pure rank planners, the manager's checks before it touches anything, ``ranks`` CLI."""

from __future__ import annotations

import json

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from elastic_pipe.cli import main
from elastic_pipe.groups import GroupManager, GroupsError, plan_pipetransformer, plan_spmd
from elastic_pipe.types import ElasticPipeError

SETTINGS = settings(max_examples=60, deadline=None)


# --- SPMD layout ------------------------------------------------------------------------------------------------


def test_spmd_layout_w8_k4() -> None:
    plan = plan_spmd(8, 4)
    assert plan.replicas == 2
    assert plan.pipeline_groups == ((0, 1, 2, 3), (4, 5, 6, 7))
    assert plan.dp_groups == ((0, 4), (1, 5), (2, 6), (3, 7))
    assert [plan.replica_of(r) for r in range(8)] == [0, 0, 0, 0, 1, 1, 1, 1]
    assert [plan.stage_of(r) for r in range(8)] == [0, 1, 2, 3, 0, 1, 2, 3]
    assert plan.rank_of(1, 2) == 6
    assert plan.pipeline_group_of(5) == (4, 5, 6, 7)
    assert plan.dp_group_of(5) == (1, 5)


def test_spmd_extremes() -> None:
    assert plan_spmd(4, 1).pipeline_groups == ((0,), (1,), (2,), (3,))
    assert plan_spmd(4, 1).dp_groups == ((0, 1, 2, 3),)
    assert plan_spmd(4, 4).dp_groups == ((0,), (1,), (2,), (3,))


def test_spmd_keeps_pipelines_inside_nodes() -> None:
    plan = plan_spmd(16, 4, gpus_per_node=8)
    assert [plan.node_of(r) for r in (0, 7, 8, 15)] == [0, 0, 1, 1]
    for group in plan.pipeline_groups:
        assert len({plan.node_of(r) for r in group}) == 1
    # data-parallel groups are the ones that cross nodes
    assert plan.dp_groups[0] == (0, 4, 8, 12)
    # a pipeline longer than a node spans whole nodes
    assert plan_spmd(16, 16, gpus_per_node=8).pipeline_groups == (tuple(range(16)),)
    assert plan_spmd(8, 2).node_of(3) is None


@SETTINGS
@given(st.integers(1, 6), st.integers(0, 4), st.data())
def test_spmd_groups_partition_the_ranks(replicas: int, log_k: int, data: st.DataObject) -> None:
    k = 2**log_k
    w = replicas * k
    plan = plan_spmd(w, k)
    for groups, size, count in ((plan.pipeline_groups, k, replicas), (plan.dp_groups, replicas, k)):
        assert len(groups) == count and all(len(g) == size for g in groups)
        assert sorted(r for g in groups for r in g) == list(range(w))
    r = data.draw(st.integers(0, w - 1))
    assert plan.pipeline_group_of(r)[plan.stage_of(r)] == r
    assert plan.dp_group_of(r)[plan.replica_of(r)] == r
    assert plan.rank_of(plan.replica_of(r), plan.stage_of(r)) == r


@pytest.mark.parametrize(
    ("args", "words"),
    [
        ((8, 3), "pipe_len 3 must divide world_size 8"),
        ((0, 1), "world_size must be an int >= 1"),
        ((8, 0), "pipe_len must be an int >= 1"),
        ((12, 4, 6), "would straddle two nodes"),
        ((8, 2, 3), "gpus_per_node 3 must divide world_size 8"),
    ],
)
def test_spmd_rejects_impossible_layouts(args: tuple[int, ...], words: str) -> None:
    with pytest.raises(GroupsError, match=words):
        plan_spmd(*args)


def test_spmd_rank_out_of_range() -> None:
    with pytest.raises(GroupsError, match=r"rank must be an int in \[0, 8\), got 8"):
        plan_spmd(8, 4).stage_of(8)
    with pytest.raises(GroupsError, match="replica in"):
        plan_spmd(8, 4).rank_of(2, 0)


def test_groups_error_is_in_the_toolkit_family() -> None:
    assert issubclass(GroupsError, ElasticPipeError) and issubclass(GroupsError, ValueError)


# --- the published PipeTransformer layout -----------------------------------------------------------------------


def test_pipetransformer_reference_example() -> None:
    # REFERENCE.md section 4: W=16, K0=8: K=8 -> [0, 8]; K=4 adds two more ranks.
    assert plan_pipetransformer(16, 8, 8).active_ranks == (0, 8)
    assert plan_pipetransformer(16, 8, 8).new_ranks == ()
    k4 = plan_pipetransformer(16, 8, 4)
    assert k4.active_ranks == (0, 1, 8, 9)
    assert k4.new_ranks == (1, 9)
    assert k4.replicas == 4
    assert plan_pipetransformer(16, 8, 2).new_ranks == (2, 3, 10, 11)
    assert plan_pipetransformer(16, 8, 1).active_ranks == tuple(range(16))


@SETTINGS
@given(st.integers(1, 4), st.integers(0, 4))
def test_pipetransformer_halvings_wake_every_rank_once(blocks: int, log_k0: int) -> None:
    k0 = 2**log_k0
    w = blocks * k0
    woken = list(plan_pipetransformer(w, k0, k0).active_ranks)
    k = k0
    while k > 1:
        k //= 2
        plan = plan_pipetransformer(w, k0, k)
        assert len(plan.active_ranks) == plan.replicas == w // k
        assert not set(plan.new_ranks) & set(woken)
        woken += plan.new_ranks
        assert sorted(woken) == list(plan.active_ranks)
    assert sorted(woken) == list(range(w))


@pytest.mark.parametrize(
    ("args", "words"),
    [
        ((16, 6, 2), "initial_pipe_len 6 must divide world_size 16"),
        ((16, 8, 3), "pipe_len 3 must divide initial_pipe_len 8"),
        ((12, 12, 1), "cannot be reached by halving"),
        ((16, 8, 0), "pipe_len must be an int >= 1"),
    ],
)
def test_pipetransformer_rejects_layouts_it_cannot_reach(args: tuple[int, int, int], words: str) -> None:
    with pytest.raises(GroupsError, match=words):
        plan_pipetransformer(*args)


# --- GroupManager before build ----------------------------------------------------------------------------------


def test_manager_constructor_validates_and_touches_nothing() -> None:
    manager = GroupManager(8, 3, [1, 4, 2, 4], backend="gloo", timeout=5)
    assert manager.pipe_lens == (4, 2, 1)
    assert not manager.built
    assert manager.plan(2).pipeline_groups == ((0, 1), (2, 3), (4, 5), (6, 7))
    with pytest.raises(GroupsError, match="not built"):
        manager.pipeline_group(4)
    with pytest.raises(GroupsError, match="not built"):
        manager.broadcast_bytes(b"x")
    with pytest.raises(GroupsError, match=r"pipe_len 8 is not one of this manager's \[4, 2, 1\]"):
        manager.plan(8)
    manager.destroy()  # harmless before build


@pytest.mark.parametrize(
    ("kwargs", "words"),
    [
        ({"pipe_lens": []}, "at least one"),
        ({"pipe_lens": [3]}, "pipe_len 3 must divide world_size 8"),
        ({"rank": 8}, r"rank must be in \[0, 8\)"),
        ({"timeout": 0}, "timeout must be"),
        ({"backend": ""}, "backend must be"),
    ],
)
def test_manager_rejects_bad_arguments(kwargs: dict[str, object], words: str) -> None:
    args: dict[str, object] = {"world_size": 8, "rank": 0, "pipe_lens": [2], "backend": "gloo", **kwargs}
    with pytest.raises(GroupsError, match=words):
        GroupManager(**args)  # type: ignore[arg-type]


def test_manager_build_needs_torch_distributed() -> None:
    with pytest.raises(GroupsError, match="not initialized"):
        GroupManager(2, 0, [1], backend="gloo").build()


# --- elastic-pipe ranks -----------------------------------------------------------------------------------------


def test_cli_ranks_spmd_json(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["ranks", "--world-size", "4", "--pipe-len", "2", "--json"]) == 0
    doc = json.loads(capsys.readouterr().out)
    assert doc["layout"] == "spmd" and doc["replicas"] == 2
    assert doc["pipeline_groups"] == [[0, 1], [2, 3]]
    assert doc["dp_groups"] == [[0, 2], [1, 3]]
    assert doc["ranks"][3] == {
        "rank": 3,
        "replica": 1,
        "stage": 1,
        "node": None,
        "pipeline_group": [2, 3],
        "dp_group": [1, 3],
    }


def test_cli_ranks_spmd_text(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["ranks", "--world-size", "8", "--pipe-len", "4", "--gpus-per-node", "4"]) == 0
    out = capsys.readouterr().out
    assert "2 replicas train side by side" in out
    assert "   5        1      1     1  [4, 5, 6, 7]            [1, 5]" in out


def test_cli_ranks_pipetransformer(capsys: pytest.CaptureFixture[str]) -> None:
    argv = ["ranks", "--world-size", "16", "--pipe-len", "4", "--initial-pipe-len", "8"]
    assert main([*argv, "--layout", "pipetransformer", "--json"]) == 0
    doc = json.loads(capsys.readouterr().out)
    assert doc["active_ranks"] == [0, 1, 8, 9] and doc["new_ranks"] == [1, 9]
    assert main([*argv, "--layout", "pipetransformer"]) == 0
    out = capsys.readouterr().out
    assert "Newly added ranks: [1, 9] (activated by going from pipeline length 8 to 4)" in out
    assert main(["ranks", "--world-size", "16", "--pipe-len", "8", "--layout", "pipetransformer", "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["new_ranks"] == []


@pytest.mark.parametrize(
    ("argv", "words"),
    [
        (["--world-size", "8", "--pipe-len", "3"], "pipe_len 3 must divide world_size 8"),
        (["--world-size", "8", "--pipe-len", "2", "--initial-pipe-len", "4"], "only applies to --layout"),
        (["--world-size", "8", "--pipe-len", "2", "--layout", "pipetransformer", "--gpus-per-node", "4"], "spmd"),
        (["--world-size", "16", "--pipe-len", "3", "--initial-pipe-len", "8", "--layout", "pipetransformer"], "3"),
    ],
)
def test_cli_ranks_bad_input_is_one_line_exit_2(
    argv: list[str], words: str, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["ranks", *argv]) == 2
    captured = capsys.readouterr()
    assert captured.out == ""
    assert captured.err.count("\n") == 1 and words in captured.err
