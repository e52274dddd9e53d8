"""Write a trained model's weights from a checkpoint as one safetensors file.

Reads the newest checkpoint of a ``[checkpoint] dir`` (the one its ``latest.json`` names, read by training's
reader: a ``file`` outside the directory is refused; without ``latest.json``, the newest ``epoch-*.pt``), or a
checkpoint file given directly, with ``torch.load(weights_only=True)`` - a sharded checkpoint's weights from its
stages' shards, each checked against its manifest - and writes the model's state dict - weights and buffers, by the
names of the model the config builds - with ``safetensors.torch.save_file``. Tensors that share memory in
the model (tied embeddings) are written as separate copies, since safetensors refuses shared storage; loading the
file with ``load_state_dict`` ties nothing back, which gives the same outputs.

``--out`` is replaced only when it is a regular file: an existing link, directory or device node there is refused
(exit 2, one line), and the file is written beside it and renamed over it, so nothing is written through a link.

The file's metadata also keeps what inference needs (``elastic_pipe.inference``, JSON: the ``[model]`` table and
how training prepared the inputs - the standardisation of the built-in image datasets, the tokenizer of text;
:mod:`elastic_pipe.orchestrator.persist.exported`), so the model and its preprocessing load back in one call::

    import elastic_pipe

    model, preprocess = elastic_pipe.load_exported("model.safetensors")
    logits = model(preprocess(raw_inputs))

Or load the weights alone into the model the same config builds::

    from safetensors.torch import load_file
    from elastic_pipe.orchestrator import load_config
    from elastic_pipe.orchestrator.components import build_model

    model = build_model(load_config("run.toml"))
    model.load_state_dict(load_file("model.safetensors"))

Examples::

    elastic-pipe export --checkpoint runs/a/ckpt --out model.safetensors
    elastic-pipe export --checkpoint runs/a/ckpt/epoch-0003.pt --out model.safetensors --json
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import stat
import tempfile
from pathlib import Path
from typing import Any

from elastic_pipe.cli._common import CliInputError, add_json_flag, emit

HELP = "Write a trained model's weights from a checkpoint as a safetensors file."


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """Declare the subcommand's options."""
    parser.add_argument(
        "--checkpoint", required=True, metavar="DIR|FILE.pt", help="a checkpoint directory (its newest) or file"
    )
    parser.add_argument("--out", required=True, metavar="FILE.safetensors", help="where the weights go")
    add_json_flag(parser)


def checkpoint_file(path: str | Path) -> Path:
    """The checkpoint file ``path`` names: itself, or for a directory the one its ``latest.json`` points at.

    ``latest.json`` is read by the reader training uses
    (:func:`~elastic_pipe.orchestrator.persist.read_latest`): its ``file`` must be a plain name inside
    the directory, not a path or a link out of it. A directory without ``latest.json`` gives its newest
    ``epoch-*.pt``, as a resume would.

    Raises:
        CliInputError: nothing there, a directory without a checkpoint, or a ``latest.json`` that is unreadable,
            points outside the directory or names a missing file.
    """
    from elastic_pipe.orchestrator.errors import ConfigError, one_line  # noqa: PLC0415
    from elastic_pipe.orchestrator.persist import checkpoint_files, read_latest  # noqa: PLC0415

    p = Path(path)
    if p.is_file():
        return p
    if not p.is_dir():
        raise CliInputError(f"--checkpoint {p}: no such file or directory")
    try:
        meta = read_latest(p)
    except ConfigError as exc:
        raise CliInputError(f"--checkpoint {p}: {one_line(str(exc))}") from None
    if meta is None:
        files = checkpoint_files(p)
        if not files:
            raise CliInputError(f"--checkpoint {p}: no checkpoint there (no latest.json); no epoch-*.pt either")
        return files[-1]
    name = str(meta["file"])
    target = p / name
    if not target.is_file():
        raise CliInputError(f"--checkpoint {p}: latest.json names {name!r}, which is missing")
    return target


def check_out(out: Path) -> None:
    """Refuse an ``--out`` that exists and is not a regular file, or is a symbolic link (to anything).

    Export replaces a regular file only: never a device node, a directory, a socket or what a link points at.

    Raises:
        CliInputError: naming the path and what it is.
    """
    try:
        info = out.lstat()
    except FileNotFoundError:
        return
    except OSError as exc:
        raise CliInputError(f"--out {out}: cannot inspect it ({exc})") from None
    if stat.S_ISLNK(info.st_mode):
        raise CliInputError(f"--out {out} is a symbolic link; give the path of a regular file (or a new one)")
    if not stat.S_ISREG(info.st_mode):
        kind = "a directory" if stat.S_ISDIR(info.st_mode) else "not a regular file (a device, pipe or socket)"
        raise CliInputError(f"--out {out} exists and is {kind}; give the path of a regular file (or a new one)")


def _write_atomic(out: Path, write: Any) -> None:
    """``write(tmp_path)`` into a fresh file beside ``out``, then rename it over ``out``.

    The rename replaces ``out`` itself: a link or special file put there after :func:`check_out` is replaced,
    never written through.
    """
    fd, tmp = tempfile.mkstemp(prefix=f".{out.name}.", suffix=".tmp", dir=out.parent)
    os.close(fd)
    umask = os.umask(0)
    os.umask(umask)
    try:
        write(tmp)
        os.chmod(tmp, 0o666 & ~umask)  # the mode a plain create gives, not mkstemp's 0600
        os.replace(tmp, out)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise


def _is_safetensors(path: Path) -> bool:
    """Whether ``path`` starts like a safetensors file: an 8-byte little-endian header length, then JSON."""
    with path.open("rb") as f:
        head = f.read(9)
    return len(head) == 9 and head[8:9] == b"{" and 0 < int.from_bytes(head[:8], "little") < 2**32


def export_weights(source: Path, out: Path) -> dict[str, Any]:
    """Write the model weights of checkpoint ``source`` to ``out``; returns what was written.

    Raises:
        CliInputError: ``source`` is not a checkpoint of this package (or cannot be read safely), or ``out`` exists
            and is not a regular file or is a symbolic link (:func:`check_out`).
    """
    import torch  # noqa: PLC0415 - torch loads only when the command runs
    from safetensors.torch import save_file  # noqa: PLC0415

    if _is_safetensors(source):  # torch.load reads these on some versions and refuses them on others
        raise CliInputError(f"{source} holds no model weights: it is a safetensors file, not a checkpoint")
    from elastic_pipe.orchestrator.errors import one_line  # noqa: PLC0415
    from elastic_pipe.orchestrator.persist import load_weights, manifest_path  # noqa: PLC0415

    weights: Any
    if manifest_path(source).is_file():  # written by elastic-pipe train: checked, whole or sharded
        try:
            weights, state = load_weights(source)
        except Exception as exc:  # a corrupt file or shard: one line, like any unreadable checkpoint
            raise CliInputError(f"cannot read checkpoint {source}: {one_line(str(exc))[:200]}") from None
    else:
        try:
            state = torch.load(source, map_location="cpu", weights_only=True)
        except Exception as exc:  # torch raises many kinds for a bad file; all mean the same here
            raise CliInputError(f"cannot read checkpoint {source}: {one_line(str(exc))[:200]}") from None
        weights = state.get("model") if isinstance(state, dict) else None
    if not weights or not isinstance(weights, dict) or not all(isinstance(t, torch.Tensor) for t in weights.values()):
        raise CliInputError(f"{source} holds no model weights (expected a checkpoint written by elastic-pipe train)")
    # safetensors refuses tensors that share storage (tied weights) or are views: write one compact copy each
    tensors = {name: t.detach().contiguous().clone() for name, t in weights.items()}
    run = state.get("run", {})
    epoch, step = run.get("epoch"), run.get("step")
    metadata = {"source": "elastic-pipe", "epoch": str(epoch), "step": str(step)}
    inference = state.get("inference")  # absent from checkpoints written before it was kept
    if isinstance(inference, dict):
        from elastic_pipe.orchestrator.persist import METADATA_KEY  # noqa: PLC0415

        metadata[METADATA_KEY] = json.dumps(inference, sort_keys=True)
    out.parent.mkdir(parents=True, exist_ok=True)
    check_out(out)
    _write_atomic(out, lambda tmp: save_file(tensors, tmp, metadata=metadata))
    return {
        "checkpoint": str(source),
        "out": str(out),
        "tensors": len(tensors),
        "parameters": sum(t.numel() for t in tensors.values()),
        "bytes": out.stat().st_size,
        "epoch": epoch,
        "step": step,
        "preprocess": inference["preprocess"]["kind"] if isinstance(inference, dict) else None,
    }


def run(args: argparse.Namespace) -> int:
    """Export the weights and say what was written."""
    out = Path(args.out)
    check_out(out)  # before reading the checkpoint: a refused --out costs nothing
    doc = export_weights(checkpoint_file(args.checkpoint), out)
    when = "" if doc["epoch"] is None else f" (after {doc['epoch']} epochs, {doc['step']} steps)"
    how = "" if doc["preprocess"] is None else f"; preprocess: {doc['preprocess']} (elastic_pipe.load_exported)"
    text = (
        f"wrote {doc['tensors']} tensors ({doc['parameters']:,} values, {doc['bytes'] / 1e6:.2f} MB) to {doc['out']} "
        f"from {doc['checkpoint']}{when}{how}"
    )
    emit(args, doc, text)
    return 0
