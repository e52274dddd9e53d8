"""Run elastic training from a TOML config, with torchrun's elastic agent underneath.

The configuration is checked first (model, policy, solver, schedule, pipeline length, world size, any checkpoint
to resume from): a bad one ends with one line on stderr and exit code 2 before any process starts. Then this node's
``nproc_per_node`` workers start; rank 0 draws a progress bar per epoch and prints a summary line per epoch and a
line per transition on stderr. At the end stdout gets a table of the epochs (or, with ``--json``, one JSON
document with the epochs, transitions, per-step losses and final accuracy).

For several nodes, run the same command on every node with ``[launch] nnodes`` and ``rdzv_endpoint`` set.
"""

from __future__ import annotations

import argparse
from typing import Any

from elastic_pipe.cli._common import CliInputError, add_json_flag, emit

HELP = "Run elastic training from a TOML config (torchrun underneath)."


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """Declare the subcommand's options."""
    parser.add_argument("--config", required=True, metavar="FILE.toml", help="the training configuration")
    parser.add_argument("--epochs", type=int, help="override [train] epochs")
    parser.add_argument("--log-dir", help="override [log] dir (events.jsonl with epoch and transition records)")
    parser.add_argument("--checkpoint-dir", help="override [checkpoint] dir")
    parser.add_argument("--rdzv-endpoint", help="override [launch] rdzv_endpoint (host:port, multi-node runs)")
    parser.add_argument("--run-id", help="job id shared by every node's agent (multi-node runs)")
    parser.add_argument("--plot", metavar="FILE.png", help="draw loss, accuracy and layout per epoch (matplotlib)")
    add_json_flag(parser)


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
            f"{'on' if e['cache'] else 'off':>5}  {e['loss']:.4f}  {e['eval_loss']:.4f}  {acc:>5}  "
            f"{e['samples_per_s']:>9.1f}  {step_ms:>7.1f}  {e['grad_sync_ops_per_s']:>10.1f}"
        )
    for t in result["transitions"]:
        lines.append(
            f"transition before epoch {t['epoch'] + 1}: frozen {t['frozen_units']} units, K={t['pipe_len']} "
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
    top.plot(epochs, [e["eval_loss"] for e in result["epochs"]], label="eval loss")
    if result["final_accuracy"] is not None:
        top.plot(epochs, [e["eval_accuracy"] for e in result["epochs"]], label="eval accuracy")
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
    # torch and the primitives load only when the command runs, so that `elastic-pipe --help` stays fast.
    from elastic_pipe.orchestrator import launch, load_config, preflight  # noqa: PLC0415
    from elastic_pipe.orchestrator.worker import entry  # noqa: PLC0415

    config = load_config(args.config)
    overrides: dict[str, Any] = {}
    for flag, key in (
        ("epochs", "train.epochs"),
        ("log_dir", "log.dir"),
        ("checkpoint_dir", "checkpoint.dir"),
        ("rdzv_endpoint", "launch.rdzv_endpoint"),
    ):
        if getattr(args, flag) is not None:
            overrides[key] = getattr(args, flag)
    config = config.override(overrides)
    preflight(config)
    results = launch(config, entry, config.to_dict(), run_id=args.run_id)
    result: dict[str, Any] = results[min(results)]
    if args.plot:
        plot(result, args.plot)
    emit(args, result, render(result))
    return 0
