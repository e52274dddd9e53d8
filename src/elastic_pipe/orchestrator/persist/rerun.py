"""What a re-run does, said before it does it: a finished run is not trained again, and a config that differs from
the checkpoint's is refused (or, when allowed, recorded).

A checkpoint's ``latest.json`` carries the config of the run that wrote it (``"config"``, the TOML's tables). A
resume may change only how the run is carried out, not what it computes:

* ``[train] epochs`` and ``[train] max_steps`` (to continue a run further),
* ``[pipeline] pipe_len`` (only the initial layout: a resumed run continues the checkpoint's, and another world size
  may need another initial length), ``[pipeline] virtual`` and ``schedule`` (the resumed layout takes this run's
  stages per rank: the checkpoint's layout, its active sub-layers cut into v stages per rank; a schedule that runs
  that v), ``[data] workers`` and ``check``, ``[train] compile`` and ``cuda_graphs`` (how the same computation is
  carried out),
* every key of ``[log]``, ``[launch]`` (the world size, restarts, endpoints) and ``[checkpoint]``.

Any other difference is refused with one line listing the differing keys, unless ``[checkpoint]
allow_config_change`` (``elastic-pipe train --allow-config-change``) is set; then the run continues with the new
config and its ``resume`` record in ``events.jsonl`` lists the changes. Checkpoints written before the config was
kept are not compared; a key added to the config after a checkpoint was written counts as unchanged while this
run leaves it at its default.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

from elastic_pipe.orchestrator.errors import ConfigError

if TYPE_CHECKING:
    from elastic_pipe.orchestrator.config import TrainConfig

__all__ = [
    "RESUMABLE_KEYS",
    "RESUMABLE_SECTIONS",
    "already_complete",
    "check_config",
    "config_changes",
    "config_defaults",
    "describe",
]

#: Keys a resume may change (besides whole :data:`RESUMABLE_SECTIONS`): how far the run goes, the initial pipeline
#: length (a resumed run continues the checkpoint's layout; another world size may need another initial length),
#: the stages per rank and the schedule (the checkpoint's layout is re-cut to this run's v,
#: :func:`.snapshot.position`), and how the same computation is carried out (data loading, compilation).
RESUMABLE_KEYS = (
    "train.epochs",
    "train.max_steps",
    "pipeline.pipe_len",
    "pipeline.virtual",
    "pipeline.schedule",
    "data.workers",
    "data.check",
    "train.compile",
    "train.cuda_graphs",
)
#: Sections a resume may change as it likes: how the run is carried out, not what it computes.
RESUMABLE_SECTIONS = ("log", "launch", "checkpoint")


def config_changes(
    saved: Mapping[str, Mapping[str, object]],
    current: Mapping[str, Mapping[str, object]],
    defaults: Mapping[str, Mapping[str, object]] | None = None,
) -> dict[str, list[object]]:
    """The ``"section.key": [saved, current]`` pairs that differ, but for what a resume may change.

    Args:
        saved: the checkpoint's config tables (:meth:`TrainConfig.to_dict`).
        current: this run's config tables.
        defaults: each section's default values (:func:`config_defaults`): a key ``saved`` lacks (added to the
            config after the checkpoint was written) is unchanged while ``current`` holds its default.
    """
    changes: dict[str, list[object]] = {}
    for section in sorted(set(saved) | set(current)):
        if section in RESUMABLE_SECTIONS:
            continue
        old, new = saved.get(section, {}), current.get(section, {})
        known = (defaults or {}).get(section, {})
        for key in sorted(set(old) | set(new)):
            name = f"{section}.{key}"
            if name in RESUMABLE_KEYS or _plain(old.get(key)) == _plain(new.get(key)):
                continue
            if key not in old and key in known and _plain(known[key]) == _plain(new.get(key)):
                continue  # a key newer than the checkpoint, left at its default
            changes[name] = [old.get(key), new.get(key)]
    return changes


def config_defaults(config: TrainConfig) -> dict[str, dict[str, object]]:
    """Each section's default values, in the tables' shape (the keys a section declares with a default)."""
    out: dict[str, dict[str, object]] = {}
    for section in config.to_dict():
        values: dict[str, object] = {}
        for f in dataclasses.fields(getattr(config, section)):
            if f.default is not dataclasses.MISSING:
                values[f.name] = f.default
            elif f.default_factory is not dataclasses.MISSING:
                values[f.name] = f.default_factory()
        out[section] = values
    return out


def _plain(value: object) -> object:
    """``value`` as JSON would give it back (tuples as lists, keys as strings), so a saved config compares equal."""
    if isinstance(value, Mapping):
        return {str(k): _plain(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_plain(v) for v in value]
    return value


def describe(changes: Mapping[str, list[object]]) -> str:
    """``"train.lr 0.001 -> 0.01, pipeline.solver 'greedy' -> 'optimal'"``."""
    return ", ".join(f"{key} {old!r} -> {new!r}" for key, (old, new) in changes.items())


def check_config(meta: Mapping[str, object] | None, config: TrainConfig) -> dict[str, list[object]]:
    """Compare ``config`` with the config of the checkpoint ``meta`` describes (its ``latest.json``).

    Returns:
        The changes (empty when none, when there is no checkpoint, or when it kept no config); non-empty only when
        ``[checkpoint] allow_config_change`` allows them.

    Raises:
        ConfigError: one line listing the differing keys, when they are not allowed.
    """
    saved = (meta or {}).get("config")
    if not isinstance(saved, Mapping):
        return {}
    changes = config_changes(saved, config.to_dict(), config_defaults(config))
    if changes and not config.checkpoint.allow_config_change:
        raise ConfigError(
            f"the config differs from the checkpoint's in {', '.join(changes)} ({describe(changes)}); a resume may "
            "change only train.epochs, train.max_steps, [log], [launch], [checkpoint] and how the run is carried out "
            "(pipeline.pipe_len, pipeline.virtual, pipeline.schedule, data.workers, train.compile, ...): pass "
            "--allow-config-change ([checkpoint] allow_config_change = true) to continue with it, or --resume never "
            "to start afresh"
        )
    return changes


def already_complete(meta: Mapping[str, Any] | None, config: TrainConfig) -> str | None:
    """The line to print when the checkpoint ``meta`` describes (its manifest as read, JSON) has finished what
    ``config`` asks; ``None`` when there is something left to train (or no checkpoint)."""
    if meta is None:
        return None
    epoch, step = int(meta.get("epoch", 0)), int(meta.get("step", 0))
    limit = config.train.max_steps
    if limit and step >= limit:
        return (
            f"run already complete (max_steps {limit} reached, {step} steps); --set train.max_steps=N to continue, "
            "--resume never to start afresh"
        )
    if epoch >= config.train.epochs:
        return f"run already complete ({epoch} epochs); --epochs N to continue, --resume never to start afresh"
    return None
