"""The parts a checkpoint is made of: named objects with ``state_dict()`` and ``load_state_dict(state)``.

torchtitan's ``CheckpointManager`` is the model: the :class:`~.checkpoint.Checkpointer` is built once with a map
``name -> Stateful`` and saves each part's state under its name, so it knows nothing of what holds the parts (it
never imports the trainer). A part's state is tensors and plain data, what ``torch.load(..., weights_only=True)``
gives back. A freeze policy, the elastic sampler and a learning-rate scheduler are parts as they are; :class:`Part`
makes one of two functions (the trainer's position, its history). The map's order is the order the parts are
saved and loaded in: a part another one depends on comes first (the position before the weights it places).

This module also checks a map (:func:`check_parts`) and takes a loaded checkpoint's entry for each part
(:func:`entries`): a part the checkpoint lacks is an error naming it, unless the map's owner gave a default for it
(what an older checkpoint, written before the part was kept, means).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

from elastic_pipe.orchestrator.errors import ConfigError

__all__ = ["Part", "Stateful"]  # check_parts, entries, RESERVED: for the Checkpointer beside it

#: The main file's own entries beside the parts' (the format, the shard table, the model's keys in order): no part
#: may be named so.
RESERVED = ("format", "keys", "shards")


class Stateful(Protocol):
    """A part of a run that a checkpoint saves and restores (torchtitan's ``Stateful``)."""

    def state_dict(self) -> object:
        """The part's state: tensors and plain data (nested dicts and lists)."""
        ...

    def load_state_dict(self, state: Any, /) -> None:
        """Continue from a state :meth:`state_dict` gave (as a checkpoint gives it back: checked, not trusted)."""
        ...


@dataclass(frozen=True, slots=True)
class Part:
    """A :class:`Stateful` made of two functions.

    Attributes:
        save: gives the part's state.
        load: takes a saved state back.
    """

    save: Callable[[], object]
    load: Callable[[Any], None]

    def state_dict(self) -> object:
        """``save()``."""
        return self.save()

    def load_state_dict(self, state: Any, /) -> None:
        """``load(state)``."""
        self.load(state)


def check_parts(parts: Mapping[str, Stateful], defaults: Mapping[str, object]) -> None:
    """Refuse a map of parts the files cannot hold.

    Raises:
        ConfigError: a name that is not a non-empty string or is one of the main file's own entries
            (:data:`RESERVED`), or a default for a part the map does not have; the message names it.
    """
    bad = [name for name in parts if not isinstance(name, str) or not name or name in RESERVED]
    if bad:
        raise ConfigError(f"checkpoint part names {bad!r}: a part needs a name other than {list(RESERVED)}")
    unknown = sorted(set(defaults) - set(parts))
    if unknown:
        raise ConfigError(f"defaults for unknown checkpoint parts {unknown}: the parts are {list(parts)}")


def entries(
    parts: Mapping[str, Stateful], defaults: Mapping[str, object], state: Mapping[str, object], source: Path
) -> dict[str, object]:
    """Each part's entry in a loaded checkpoint's ``state``, by name in the map's order (its default when the
    checkpoint has none).

    Raises:
        ConfigError: the checkpoint (``source``) holds no entry for a part without a default; the message names
            the parts missing and those the checkpoint holds.
    """
    missing = [name for name in parts if name not in state and name not in defaults]
    if missing:
        held = sorted(name for name in state if name not in RESERVED)
        raise ConfigError(f"{source}: the checkpoint holds no part {missing} (it holds {held})")
    return {name: state[name] if name in state else defaults[name] for name in parts}
