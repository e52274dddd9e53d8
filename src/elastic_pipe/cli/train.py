"""Run elastic training from a TOML config, with torchrun's elastic agent underneath.

The configuration is checked first (model, policy, solver, schedule, pipeline length, world size, any checkpoint
to resume from): a bad one ends with one line on stderr and exit code 2 before any process starts. Then this node's
``nproc_per_node`` workers start; rank 0 shows each epoch's progress on stderr (a bar on a terminal, a plain line
every tenth of the epoch otherwise) and prints a summary line per epoch and a line per transition. At the end
stdout gets a table of the epochs (or, with ``--json``, one JSON document with the epochs, transitions, per-step
losses and final accuracy).

Any key of the file can be changed for one run with ``--set section.key=value`` (repeatable; the value is read
as TOML, so ``0.01``, ``true``, ``"adamw"`` and ``{ alpha = 0.2 }`` work, and a bare word is a string), or one
option of a table with ``--set section.table.key=value``. The flags ``--epochs``, ``--nproc-per-node`` and the
like are shorthands for ``--set``; they win over it.

Examples::

    elastic-pipe train --config run.toml --nproc-per-node 4 --set train.lr=0.01 --set freeze.options={alpha=0.2}
    elastic-pipe train --config run.toml --epochs 8 --resume auto      # continue the run in [checkpoint] dir
    elastic-pipe train --config run.toml --resume runs/a/ckpt          # continue the run checkpointed there

A re-run says what it does: resuming a finished run prints ``run already complete (E epochs); --epochs N to
continue, --resume never to start afresh`` and exits 0; a config that differs from the checkpoint's in more than a
resume may change (epochs, max_steps, ``[log]``, ``[launch]``, ``[checkpoint]``) is refused with one line naming the
keys, unless ``--allow-config-change`` (:mod:`elastic_pipe.orchestrator.persist.rerun`).

For several nodes, run the same command on every node with ``--nnodes`` (or ``[launch] nnodes``),
``--rdzv-endpoint`` and the same ``--run-id`` and rendezvous secret (``--rdzv-secret-file``) set.
"""

from __future__ import annotations

import argparse
import contextlib
import copy
import math
import os
import sys
import tomllib
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any

from elastic_pipe.cli._common import CliInputError, add_json_flag, emit

if TYPE_CHECKING:
    from elastic_pipe.orchestrator.config import TrainConfig

HELP = "Run elastic training from a TOML config (torchrun underneath)."


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """Declare the subcommand's options."""
    parser.add_argument("--config", required=True, metavar="FILE.toml", help="the training configuration")
    parser.add_argument(
        "--set",
        action="append",
        default=[],
        dest="settings",
        metavar="SECTION.KEY=VALUE",
        help="override one key of the file (repeatable; VALUE is TOML, e.g. train.lr=0.01, freeze.options={alpha=0.2})",
    )
    parser.add_argument("--epochs", type=int, help="override [train] epochs")
    parser.add_argument("--nproc-per-node", type=int, help="override [launch] nproc_per_node (processes on this node)")
    parser.add_argument("--nnodes", type=int, help="override [launch] nnodes")
    parser.add_argument("--max-restarts", type=int, help="override [launch] max_restarts")
    parser.add_argument("--rdzv-endpoint", help="override [launch] rdzv_endpoint (host:port, multi-node runs)")
    parser.add_argument("--log-dir", help="override [log] dir (events.jsonl with epoch and transition records)")
    parser.add_argument("--checkpoint-dir", help="override [checkpoint] dir")
    parser.add_argument(
        "--resume",
        metavar="auto|never|DIR",
        help="auto: continue from the newest checkpoint in [checkpoint] dir if there is one; never: start afresh; "
        "DIR: continue the run checkpointed in DIR (it must hold one; new checkpoints go there too)",
    )
    parser.add_argument(
        "--allow-config-change",
        action="store_true",
        default=None,
        help="resume although the config differs from the checkpoint's in more than epochs, max_steps, [log], "
        "[launch] and [checkpoint] (the resume record in events.jsonl lists the changes)",
    )
    parser.add_argument("--run-id", help="job id shared by every node's agent (multi-node runs)")
    parser.add_argument(
        "--rdzv-secret-file",
        metavar="FILE",
        help="file holding the rendezvous secret shared by every node (hex, at least 128 bits, mode 600; "
        "multi-node runs; or set ELASTIC_PIPE_RDZV_SECRET_FILE or ELASTIC_PIPE_RDZV_SECRET)",
    )
    parser.add_argument("--plot", metavar="FILE.png", help="draw loss, accuracy and layout per epoch (matplotlib)")
    add_json_flag(parser)


#: The flags that override one key each, and the key.
FLAG_KEYS = (
    ("epochs", "train.epochs"),
    ("nproc_per_node", "launch.nproc_per_node"),
    ("nnodes", "launch.nnodes"),
    ("max_restarts", "launch.max_restarts"),
    ("rdzv_endpoint", "launch.rdzv_endpoint"),
    ("log_dir", "log.dir"),
    ("checkpoint_dir", "checkpoint.dir"),
    ("allow_config_change", "checkpoint.allow_config_change"),
)


def parse_setting(text: str) -> tuple[str, Any]:
    """``"section.key=value"`` as ``("section.key", value)``, the value read as a TOML value.

    A value that is not TOML (a bare word such as ``adamw``) is taken as the string it is.

    Raises:
        CliInputError: no ``=`` or no dotted key before it.
    """
    key, sep, raw = text.partition("=")
    key = key.strip()
    if not sep or "." not in key or not all(key.split(".")):
        raise CliInputError(f"--set {text!r}: expected SECTION.KEY=VALUE, e.g. train.lr=0.01")
    raw = raw.strip()
    try:
        value = tomllib.loads(f"value = {raw}")["value"]
    except tomllib.TOMLDecodeError:
        value = raw
    return key, value


def overrides_from(args: argparse.Namespace, config: TrainConfig) -> dict[str, Any]:
    """The ``{"section.key": value}`` changes that ``--set``, the shorthand flags and ``--resume`` ask for.

    ``section.table.key`` changes one entry of a table-valued key (``model.options.depth=2``), keeping the others.

    Raises:
        CliInputError: a malformed ``--set``, ``--resume DIR`` without a checkpoint in it, or with another
            ``--checkpoint-dir``.
    """
    tables = config.to_dict()
    overrides: dict[str, Any] = {}
    for text in args.settings:
        key, value = parse_setting(text)
        section, name, *rest = key.split(".", 2)
        if rest:  # one entry of a table such as [model] options
            base = overrides.get(f"{section}.{name}", tables.get(section, {}).get(name))
            if not isinstance(base, dict):
                raise CliInputError(f"--set {text!r}: {section}.{name} is not a table of options")
            value = {**copy.deepcopy(base), rest[0]: value}
        overrides[f"{section}.{name}"] = value
    for flag, key in FLAG_KEYS:
        if getattr(args, flag) is not None:
            overrides[key] = getattr(args, flag)
    resume = args.resume
    if resume in ("auto", "never"):
        overrides["checkpoint.resume"] = resume
    elif resume is not None:
        directory = Path(resume)
        if not (directory / "latest.json").is_file() and not any(directory.glob("epoch-*.pt")):
            raise CliInputError(
                f"--resume {resume}: no checkpoint there (no latest.json, no epoch-*.pt); expected auto, never or DIR"
            )
        given = overrides.get("checkpoint.dir")
        if given and Path(given).resolve() != directory.resolve():
            raise CliInputError(
                f"--resume {resume} continues the run checkpointed there (and checkpoints it there); "
                f"it conflicts with --checkpoint-dir {given}"
            )
        overrides["checkpoint.dir"] = str(directory)
        overrides["checkpoint.resume"] = "auto"
    return overrides


def _number(value: float | None, spec: str, empty: str = "-") -> str:
    return empty if value is None else format(value, spec)


def render(result: dict[str, Any]) -> str:
    """The final table."""
    lines = [
        "epoch  frozen  K  R  cache  loss     eval     acc    samples/s  step ms  sync ops/s",
    ]
    for e in result["epochs"]:
        acc = "-" if e["eval_accuracy"] is None else f"{e['eval_accuracy']:.3f}"
        step_ms = e["seconds"] / max(e["steps"], 1) * 1e3
        lines.append(
            f"{e['epoch'] + 1:>5}  {e['frozen_units']:>6}  {e['pipe_len']}  {e['replicas']}  "
            f"{'on' if e['cache'] else 'off':>5}  {e['loss']:.4f}  {_number(e['eval_loss'], '.4f'):>6}  {acc:>5}  "
            f"{e['samples_per_s']:>9.1f}  {step_ms:>7.1f}  {e['grad_sync_ops_per_s']:>10.1f}"
        )
    for t in result["transitions"]:
        inside = t.get("epoch_step", 0)  # a transition inside an epoch ([freeze] decide_every)
        where = f"in epoch {t['epoch'] + 1} after step {inside}" if inside else f"before epoch {t['epoch'] + 1}"
        lines.append(
            f"transition {where}: frozen {t['frozen_units']} units, K={t['pipe_len']} "
            f"R={t['replicas']}, {t['bytes_moved'] / 1e6:.2f} MB moved, {t['seconds']:.3f} s"
        )
    acc = result["final_accuracy"]
    lines.append(
        f"final eval loss {result['final_eval_loss']:.4f}"
        + ("" if acc is None else f", accuracy {acc:.3f}")
        + f", {result['seconds']:.1f} s"
    )
    return "\n".join(lines)


def plot(result: dict[str, Any], path: str) -> None:
    """Loss, accuracy and (K, R, frozen) per epoch in one figure."""
    try:
        import matplotlib  # noqa: PLC0415 - optional extra

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt  # noqa: PLC0415 - optional extra
    except ImportError as exc:
        raise CliInputError("--plot needs matplotlib: pip install 'elastic-pipe[plots]'") from exc
    epochs = [e["epoch"] + 1 for e in result["epochs"]]
    fig, (top, bottom) = plt.subplots(2, 1, figsize=(7, 6), sharex=True)
    top.plot(epochs, [e["loss"] for e in result["epochs"]], label="train loss")
    evaluated = [math.nan if e["eval_loss"] is None else e["eval_loss"] for e in result["epochs"]]
    top.plot(epochs, evaluated, label="eval loss")
    if result["final_accuracy"] is not None:
        accuracy = [math.nan if e["eval_accuracy"] is None else e["eval_accuracy"] for e in result["epochs"]]
        top.plot(epochs, accuracy, label="eval accuracy")
    top.legend()
    for key, label in (("pipe_len", "pipeline length K"), ("replicas", "replicas R"), ("frozen_units", "frozen")):
        bottom.step(epochs, [e[key] for e in result["epochs"]], where="mid", label=label)
    bottom.set_xlabel("epoch")
    bottom.legend()
    fig.tight_layout()
    fig.savefig(path)
    plt.close(fig)


def run(args: argparse.Namespace) -> int:
    """Check the configuration, launch the workers, print the result."""
    # torch and the primitives load only when the command runs (in _run), so that `elastic-pipe --help` stays fast.
    with user_import_paths(args.config):
        return _run(args)


@contextlib.contextmanager
def user_import_paths(config_file: str) -> Iterator[list[str]]:
    """Put the current directory and ``config_file``'s directory first on ``sys.path`` and on the workers'
    ``PYTHONPATH`` while the run lasts, as ``python -m`` and torchrun put the script's directory: a
    ``"module:attr"`` in the config then imports in this process (its checks) and in every worker alike."""
    paths = list(dict.fromkeys([os.getcwd(), str(Path(config_file).resolve().parent)]))
    saved_path, saved_env = list(sys.path), os.environ.get("PYTHONPATH")
    sys.path[:0] = [p for p in paths if p not in sys.path]
    os.environ["PYTHONPATH"] = os.pathsep.join([*paths, *filter(None, [saved_env])])
    try:
        yield paths
    finally:
        sys.path[:] = saved_path
        if saved_env is None:
            os.environ.pop("PYTHONPATH", None)
        else:
            os.environ["PYTHONPATH"] = saved_env


def _run(args: argparse.Namespace) -> int:
    from elastic_pipe.orchestrator import launch, load_config, preflight  # noqa: PLC0415
    from elastic_pipe.orchestrator.persist import already_complete  # noqa: PLC0415
    from elastic_pipe.orchestrator.worker import entry  # noqa: PLC0415

    config = load_config(args.config)
    config = config.override(overrides_from(args, config))
    # a config that differs from the checkpoint's is refused there (rerun.check_config)
    resume = preflight(config)["resume"]
    if resume is not None:
        done = already_complete(resume, config)
        if done is not None:  # nothing to train: say so, start no process
            print(done, file=sys.stderr)
            if args.json:
                emit(args, {"complete": True, "message": done}, "")
            return 0
    results = launch(config, entry, config.to_dict(), run_id=args.run_id, secret_file=args.rdzv_secret_file)
    result: dict[str, Any] = results[min(results)]
    if args.plot:
        plot(result, args.plot)
    emit(args, result, render(result))
    return 0
