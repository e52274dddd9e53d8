"""What a run keeps on disk and reads back: checkpoints (one shard per stage plus a main file, with manifests,
verified on load, with fallback to an older one), the state they hold, what a re-run may change, and the inference
record of an exported model.

Modules: :mod:`.checkpoint` (the :class:`Checkpointer`, built with a map of named :class:`Stateful` parts: when to
save, which part goes in which file, the ranks agreeing on a checkpoint to resume, each part restored by name),
:mod:`.parts` (the :class:`Stateful` protocol, :class:`Part`, the checks of a map of parts), :mod:`.snapshot` (the
parts of a rank's share that are tensors - weights, optimizer state - restored on any layout, and the position,
re-cut to the config's stages per rank), :mod:`.files` (the
files' names, manifests and atomic writes, pruning), :mod:`.loads` (verified loads with fallback, whether a
checkpoint fits the model), :mod:`.shards` (a sharded checkpoint's shards, read and checked tensor by tensor),
:mod:`.integrity` (checksums and value checks), :mod:`.rerun` (what a resume may change, and a finished run),
:mod:`.exported` (the inference record; loading an export back is
:mod:`~elastic_pipe.orchestrator.exported_model`). They are not API: the rest of the orchestrator uses what this
face exports.
"""

from __future__ import annotations

from elastic_pipe.orchestrator.persist.checkpoint import Checkpointer, Found
from elastic_pipe.orchestrator.persist.exported import METADATA_KEY
from elastic_pipe.orchestrator.persist.files import checkpoint_files, manifest_path, read_latest
from elastic_pipe.orchestrator.persist.loads import candidate_manifests, check_compatible, fingerprint, load_weights
from elastic_pipe.orchestrator.persist.parts import Part, Stateful
from elastic_pipe.orchestrator.persist.rerun import already_complete

__all__ = [
    "METADATA_KEY",
    "Checkpointer",
    "Found",
    "Part",
    "Stateful",
    "already_complete",
    "candidate_manifests",
    "check_compatible",
    "checkpoint_files",
    "fingerprint",
    "load_weights",
    "manifest_path",
    "read_latest",
]
