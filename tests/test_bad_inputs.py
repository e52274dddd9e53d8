"""Bad input, table-driven: every case exits 2 with one stderr line naming the bad value.

Two tables: the data subcommands' flags and input files (``CASES``), and ``elastic-pipe train``'s configuration
files and checkpoint indexes (``TRAIN_CASES``, ``CHECKPOINT_CASES``, counted per category in ``COUNTS``).

The CLI runs in-process (``main([...])``): argparse usage errors raise ``SystemExit(2)``, everything else returns
2; either way stdout stays empty (the ``--json`` document is all or nothing) and no traceback is printed.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from elastic_pipe.cli import main

#: A costs file written for each case; ``COSTS`` in an argv is replaced by its path.
GOOD_COSTS = "[1, 2, 3, 4]"

CASES: list[tuple[str, list[str], str, str]] = [
    # (subcommand, argv after it, costs file content, text the error line must hold)
    ("partition", ["--costs", "COSTS", "--stages", "0"], GOOD_COSTS, "got 0"),
    ("partition", ["--costs", "COSTS", "--stages", "9"], GOOD_COSTS, "into 9"),
    ("partition", ["--costs", "COSTS", "--stages", "two"], GOOD_COSTS, "'two'"),
    ("partition", ["--costs", "COSTS", "--stages", "2", "--solver", "magic"], GOOD_COSTS, "'magic'"),
    ("partition", ["--costs", "COSTS", "--stages", "2", "--frozen", "-1"], GOOD_COSTS, "-1"),
    ("partition", ["--costs", "COSTS", "--stages", "2"], "[1, -5]", "-5"),
    ("partition", ["--costs", "COSTS", "--stages", "2"], '[1, "x"]', "'x'"),
    ("partition", ["--costs", "COSTS", "--stages", "2"], "[1, NaN]", "nan"),
    ("partition", ["--costs", "COSTS", "--stages", "2"], "[[[[", "not valid JSON"),
    ("partition", ["--costs", "/no/such/costs.json", "--stages", "2"], GOOD_COSTS, "/no/such/costs.json"),
    ("compress", ["--costs", "COSTS", "--from", "4", "--budget", "plenty"], GOOD_COSTS, "'plenty'"),
    ("compress", ["--costs", "COSTS", "--from", "0", "--budget", "10"], GOOD_COSTS, "got 0"),
    ("compress", ["--costs", "COSTS", "--from", "4", "--budget", "10", "--solver", "magic"], GOOD_COSTS, "'magic'"),
    ("compress", ["--costs", "COSTS", "--from", "4", "--budget", "10", "--rule", "fold"], GOOD_COSTS, "'fold'"),
    ("compress", ["--costs", "COSTS", "--from", "4", "--budget", "10"], "{}", "got dict"),
    ("schedule", ["--kind", "2f2b", "--stages", "4", "--microbatches", "8"], "", "'2f2b'"),
    ("schedule", ["--kind", "1f1b", "--stages", "0", "--microbatches", "8"], "", "got 0"),
    ("schedule", ["--kind", "1f1b", "--stages", "4", "--microbatches", "-3"], "", "got -3"),
    ("schedule", ["--kind", "1f1b", "--stages", "1000000000", "--microbatches", "8"], "", "1000000000"),
    ("schedule", ["--kind", "1f1b", "--stages", "4", "--microbatches", "1000000000"], "", "1000000000"),
    (
        "schedule",
        ["--kind", "interleaved", "--stages", "4", "--microbatches", "8", "--chunks", "1000000000"],
        "",
        "1000000000",
    ),
    ("schedule", ["--kind", "1f1b", "--stages", "512", "--microbatches", "4096"], "", "6291456"),
    (
        "schedule",
        ["--kind", "1f1b", "--stages", "4", "--microbatches", "8", "--costs", '{"forward": 1e308}'],
        "",
        "inf",
    ),
    (
        "schedule",
        ["--kind", "1f1b", "--stages", "4", "--microbatches", "8", "--costs", '{"forward": -1}'],
        "",
        "-1",
    ),
    (
        "schedule",
        ["--kind", "1f1b", "--stages", "4", "--microbatches", "8", "--costs", '{"speed": 1}'],
        "",
        "speed",
    ),
    (
        "schedule",
        ["--kind", "1f1b", "--stages", "4", "--microbatches", "8", "--costs", "{oops"],
        "",
        "not valid JSON",
    ),
    (
        "freeze-plan",
        ["--policy", "alpha", "--alpha", "0.5", "--layers", "12", "--epochs", "1000000000"],
        "",
        "1000000000",
    ),
    (
        "freeze-plan",
        ["--policy", "alpha", "--alpha", "0.5", "--layers", "1000000000", "--epochs", "3"],
        "",
        "1000000000",
    ),
    (
        "freeze-plan",
        ["--policy", "freezeout", "--t0", "0.5", "--layers", "100000", "--epochs", "100000"],
        "",
        "10000000000",
    ),
    ("freeze-plan", ["--policy", "alpha", "--alpha", "7/0", "--layers", "12", "--epochs", "3"], "", "'7/0'"),
    ("freeze-plan", ["--policy", "alpha", "--alpha", "2", "--layers", "12", "--epochs", "3"], "", "2"),
    ("freeze-plan", ["--policy", "sometimes", "--layers", "12", "--epochs", "3"], "", "'sometimes'"),
    ("freeze-plan", ["--policy", "manual", "--schedule", "x:y", "--layers", "12", "--epochs", "3"], "", "x:y"),
    ("freeze-plan", ["--policy", "alpha", "--alpha", "0.5", "--layers", "-4", "--epochs", "3"], "", "-4"),
    ("decode", ["zz"], "", "not hex"),
    ("decode", ["00ff"], "", "2 bytes"),
    ("decode", ["--legacy", "1, 2, x"], "", "'x'"),
    ("decode", ["--legacy", "1, 2, 3"], "", "3"),
    ("decode", ["--legacy", "--num-layers", "-2", "1,2"], "", "-2"),
    ("decode", ["00", "--num-layers", "3"], "", "--num-layers"),
    ("ranks", ["--world-size", "1000000000", "--pipe-len", "1"], "", "1000000000"),
    ("ranks", ["--world-size", "16384", "--pipe-len", "1"], "", "268451840"),
    ("ranks", ["--world-size", "8", "--pipe-len", "3"], "", "3"),
    ("ranks", ["--world-size", "0", "--pipe-len", "1"], "", "0"),
    ("ranks", ["--world-size", "8", "--pipe-len", "2", "--layout", "ring"], "", "'ring'"),
    ("ranks", ["--world-size", "8", "--pipe-len", "2", "--initial-pipe-len", "4"], "", "--initial-pipe-len"),
    (
        "ranks",
        ["--world-size", "8", "--pipe-len", "2", "--layout", "pipetransformer", "--initial-pipe-len", "3"],
        "",
        "3",
    ),
    ("plan", ["--model", "vit-b16", "--gpus", "1000000000"], "", "1000000000"),
    ("plan", ["--model", "vit-b16", "--gpus", "16", "--epochs", "1000000000"], "", "1000000000"),
    ("plan", ["--model", "vit-b16", "--gpus", "16", "--microbatches", "1000000000"], "", "1000000000"),
    ("plan", ["--model", "vit-b16", "--gpus", "16", "--pipe-len", "1000000000"], "", "1000000000"),
    ("plan", ["--model", "vit-b16", "--gpus", "16", "--epochs", "2", "--host-overhead-ms", "1e308"], "", "inf"),
    ("plan", ["--model", "vit-b16", "--gpus", "16", "--epochs", "2", "--intra-bw", "1e-308"], "", "overflow"),
    ("plan", ["--model", "vit-b16", "--gpus", "16", "--gpu-tflops", "0"], "", "got 0"),
    ("plan", ["--model", "vit-huge9", "--gpus", "16"], "", "vit-huge9"),
    ("plan", ["--model", "vit-b16", "--gpus", "16", "--alpha", "lots"], "", "'lots'"),
    ("plan", ["--model", "vit-b16", "--gpus", "16", "--cache-fill", "later"], "", "'later'"),
    ("plan", ["--costs", "COSTS", "--gpus", "2"], '{"layers": []}', "non-empty"),
]


def _case_id(case: tuple[str, list[str], str, str]) -> str:
    command, argv, _, _ = case
    return f"{command}:{' '.join(argv)[:60]}"


@pytest.mark.parametrize("case", CASES, ids=[_case_id(c) for c in CASES])
def test_bad_input_exits_2_with_one_line(
    case: tuple[str, list[str], str, str], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    command, argv, content, needle = case
    costs = tmp_path / "costs.json"
    costs.write_text(content, encoding="utf-8")
    words = [command, *(str(costs) if word == "COSTS" else word for word in argv), "--json"]
    try:
        code = main(words)
    except SystemExit as exc:  # argparse's own usage errors
        code = exc.code  # type: ignore[assignment]
    captured = capsys.readouterr()
    assert code == 2, captured.err
    assert captured.out == ""
    assert captured.err.count("\n") == 1 and captured.err.endswith("\n"), captured.err
    assert captured.err.startswith(f"elastic-pipe {command}: error: ")
    assert needle in captured.err, captured.err
    assert "Traceback" not in captured.err


def test_every_data_subcommand_has_cases() -> None:
    counts = {command: sum(1 for c in CASES if c[0] == command) for command, *_ in CASES}
    assert set(counts) == {"partition", "compress", "schedule", "freeze-plan", "decode", "ranks", "plan"}
    assert min(counts.values()) >= 5


# --- elastic-pipe train: configuration files and checkpoints -----------------------------------------------------

#: TRAIN_BASE without its [pipeline] table, for the cases that write their own (``"!" + TRAIN_HEAD + ...``).
TRAIN_HEAD = """
[model]
name = "vit"
options = { preset = "vit-tiny", depth = 2, dim = 16, heads = 2, mlp_dim = 32, patch_size = 4 }
[launch]
nproc_per_node = 1
"""

#: A small valid configuration; each case below changes one thing of it.
TRAIN_BASE = """
[model]
name = "vit"
options = { preset = "vit-tiny", depth = 2, dim = 16, heads = 2, mlp_dim = 32, patch_size = 4 }
[pipeline]
pipe_len = 2
[launch]
nproc_per_node = 2
"""

#: (category, TOML appended to TRAIN_BASE, text the error line must hold). A case starting with "!" replaces the
#: file instead (TOML refuses a repeated table, so an appended case only adds tables TRAIN_BASE lacks).
TRAIN_CASES: list[tuple[str, str, str]] = [
    ("unknown table or key", "[modle]\nname = 'vit'\n", "[modle]"),
    ("unknown table or key", "[train]\nepoch = 3\n", "'epoch'"),
    ("unknown table or key", "[freeze]\npolicy = 'alpha'\nalfa = 0.5\n", "'alfa'"),
    ("unknown table or key", "!model = 'vit'\n", "[model]"),
    ("unknown table or key", "!\n", "[model] name is required"),
    ("unknown table or key", "![model\nname = 'vit'\n", "not valid TOML"),
    ("wrong type", "[train]\nepochs = 'three'\n", "'three'"),
    ("wrong type", "[train]\nlr = 'fast'\n", "'fast'"),
    ("wrong type", "[train]\nglobal_batch = 6.5\n", "got 6.5"),
    ("wrong type", "!\n[model]\nname = 'vit'\noptions = 3\n", "got 3"),
    ("wrong type", "[data]\ndataset = 7\n", "got 7"),
    ("wrong type", "[log]\nprogress = 'sometimes'\n", "'sometimes'"),
    ("out of range", "[train]\nepochs = 0\n", "got 0"),
    ("out of range", "[train]\nlr = -1.0\n", "got -1.0"),
    ("out of range", "[train]\nglobal_batch = 30\n", "global_batch=30"),
    ("out of range", "[train]\nepochs = 1000000000000\n", "1000000000000"),
    ("out of range", "[train]\ndtype = 'float7'\n", "'float7'"),
    ("out of range", "[data]\neval_fraction = 1.5\n", "got 1.5"),
    ("out of range", "[checkpoint]\nresume = 'sometimes'\n", "'sometimes'"),
    ("out of range", "[checkpoint]\nkeep_last = -2\n", "got -2"),
    # a registered schedule the runtime cannot run (two stages per rank): refused before any worker starts
    ("out of range", f"!{TRAIN_HEAD}[pipeline]\nschedule = 'interleaved'\n", "'interleaved' cannot run here"),
    ("bad import path", "[freeze]\npolicy = 'no_such_module_xyz:Plateau'\n", "no_such_module_xyz"),
    ("bad import path", "[freeze]\npolicy = 'os.path:NoSuchPolicy'\n", "NoSuchPolicy"),
    ("bad import path", "[data]\ndataset = 'no_such_module_xyz:train_set'\n", "no_such_module_xyz"),
    ("bad import path", "[data]\ndataset = 'os:no_such_loader'\n", "no_such_loader"),
    ("bad import path", "!\n[model]\nname = 'no_such_module_xyz:build'\n", "no_such_module_xyz"),
    ("bad import path", "!\n[model]\nname = 'os.path:join'\n", "'os.path:join'"),
    # a module that raises when imported (tests/plugins/plug_import_fails.py): the key and the exception
    ("bad import path", "[freeze]\npolicy = 'plug_import_fails:Policy'\n", "([freeze] policy): importing"),
    ("bad import path", "[data]\ndataset = 'plug_import_fails:digits'\n", "([data] dataset): importing"),
    ("bad import path", "!\n[model]\nname = 'plug_import_fails:build'\n", "([model] name): importing"),
    # a solver that is not callable or raises, a compression rule or a policy that raises
    # (tests/plugins/plug_broken.py): found before any worker starts
    (
        "broken solver",
        "!" + TRAIN_BASE.replace("pipe_len = 2", "pipe_len = 2\nsolver = 'plug_broken:NOT_CALLABLE'"),
        "([pipeline] solver) is a int, not",
    ),
    (
        "broken solver",
        "!" + TRAIN_BASE.replace("pipe_len = 2", "pipe_len = 2\nsolver = 'plug_broken:broken_solver'"),
        "ZeroDivisionError",
    ),
    (
        "broken solver",
        "!" + TRAIN_BASE.replace("pipe_len = 2", "pipe_len = 2\ncompression = 'plug_broken:BROKEN_RULE'"),
        "[pipeline] compression 'plug_broken:BROKEN_RULE' failed on the layout after freezing one unit: KeyError",
    ),
    (
        "broken solver",
        "!" + TRAIN_BASE.replace("pipe_len = 2", "pipe_len = 2\ncompression = 'plug_broken:NOT_CALLABLE'"),
        "([pipeline] compression 'plug_broken:NOT_CALLABLE') lacks the CompressionRule members",
    ),
    ("broken policy", "[freeze]\npolicy = 'plug_broken:undecided'\n", "failed on the first decision (epoch 1"),
    # fewer training samples than one global batch (20 items, 4 held out): before any worker starts
    (
        "dataset shorter than the global batch",
        "[data]\ndataset = 'plug_data:flipped_digits'\noptions = { samples = 20 }\n",
        "exceeds the 16 training samples",
    ),
    ("cache tiers", f"!{TRAIN_HEAD}[pipeline]\ncache_tiers = {{ device = '20 gigs' }}\n", "'20 gigs'"),
    ("cache tiers", f"!{TRAIN_HEAD}[pipeline]\ncache_tiers = {{ hots = '1GiB' }}\n", "'hots'"),
    ("cache tiers", f"!{TRAIN_HEAD}[pipeline]\ncache_policy = 'sometimes'\n", "'sometimes'"),
    ("cache tiers", f"!{TRAIN_HEAD}[pipeline]\nviews = 3\n", "views = 3"),
    # a cache directory that cannot be written: refused in preflight, before any worker starts
    ("cache tiers", f"!{TRAIN_HEAD}[pipeline]\ncache_tiers = {{ disk = '/etc/hostname/c' }}\n", "'/etc/hostname/c'"),
    ("cache tiers", f"!{TRAIN_HEAD}[pipeline]\ncache_tiers = {{ host_dir = '/proc/ep-c' }}\n", "'/proc/ep-c'"),
]

#: (category, latest.json content, text the error line must hold); the checkpoint dir is CKPT.
CHECKPOINT_CASES: list[tuple[str, str, str]] = [
    ("checkpoint", "{not json", "cannot read checkpoint index"),
    ("checkpoint", '{"file": "../../outside.pt"}', "'../../outside.pt'"),
    ("checkpoint", '{"file": "/etc/passwd"}', "'/etc/passwd'"),
    ("checkpoint", "[1, 2, 3]", "must name a file inside"),
    ("checkpoint", '{"file": 7}', "got 7"),
    ("checkpoint", '{"format": 999, "file": "epoch-0001.pt", "fingerprint": {}}', "999"),
]

#: Tried and handled (exit 2, one line naming the value, no traceback) per category; the last test prints it.
#: Disk-cache files: no CLI or API entry reads one from an earlier run (a run's cache files carry a fresh name and
#: are deleted when it ends; a damaged entry met during the run is recomputed and counted, see
#: tests/test_training_cache_tiers.py), so only the cache's directories and keys have a category.
COUNTS: dict[str, list[int]] = {}


def _count(category: str, handled: bool) -> None:
    tried_handled = COUNTS.setdefault(category, [0, 0])
    tried_handled[0] += 1
    tried_handled[1] += int(handled)


def _train_fails_with_one_line(argv: list[str], needle: str, capsys: pytest.CaptureFixture[str]) -> tuple[bool, str]:
    try:
        code = main(argv)
    except SystemExit as exc:
        code = exc.code  # type: ignore[assignment]
    captured = capsys.readouterr()
    err = captured.err
    handled = (
        code == 2
        and captured.out == ""
        and err.count("\n") == 1
        and err.startswith("elastic-pipe train: error: ")
        and needle in err
        and "Traceback" not in err
    )
    return handled, f"exit {code}: {err!r}"


@pytest.mark.parametrize("case", TRAIN_CASES, ids=[f"{c[0]}:{c[1][:40]}" for c in TRAIN_CASES])
def test_bad_train_config_exits_2_with_one_line(
    case: tuple[str, str, str], tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    category, toml, needle = case
    monkeypatch.syspath_prepend(str(Path(__file__).parent / "plugins"))
    path = tmp_path / "run.toml"
    path.write_text(toml[1:] if toml.startswith("!") else TRAIN_BASE + toml, encoding="utf-8")
    handled, detail = _train_fails_with_one_line(["train", "--config", str(path)], needle, capsys)
    _count(category, handled)
    assert handled, detail


@pytest.mark.parametrize("case", CHECKPOINT_CASES, ids=[f"{c[0]}:{c[1][:40]}" for c in CHECKPOINT_CASES])
def test_bad_checkpoint_exits_2_with_one_line(
    case: tuple[str, str, str], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    category, latest, needle = case
    path = tmp_path / "run.toml"
    path.write_text(TRAIN_BASE, encoding="utf-8")
    ckpt = tmp_path / "ckpt"
    ckpt.mkdir()
    (ckpt / "latest.json").write_text(latest, encoding="utf-8")
    handled, detail = _train_fails_with_one_line(
        ["train", "--config", str(path), "--checkpoint-dir", str(ckpt)], needle, capsys
    )
    _count(category, handled)
    assert handled, detail


def test_zz_counts_per_category(capsys: pytest.CaptureFixture[str]) -> None:
    """Print tried/handled per category (runs last in this module; complete when the whole module ran)."""
    expected = {c[0] for c in TRAIN_CASES + CHECKPOINT_CASES}
    with capsys.disabled():
        for category, (tried, handled) in sorted(COUNTS.items()):
            print(f"\n{category}: {handled}/{tried} handled")
    assert set(COUNTS) <= expected
    assert all(tried == handled for tried, handled in COUNTS.values())
