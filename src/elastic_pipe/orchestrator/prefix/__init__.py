"""The frozen prefix of a run (:class:`FrozenPrefix`, one per rank): its activation cache (built from
``[pipeline]``, carried to a new boundary, judged, filled and read), whether its weights are released while the
cache serves it, and the evaluation outputs kept while they are.

Modules: :mod:`.frozen` (the face object), :mod:`.build` (the cache's tiers, built and released), :mod:`.fill`
(carried, judged, filled), :mod:`.reads` (read during an epoch), :mod:`.residency` (released and restored),
:mod:`.state` (released or not, the evaluation outputs). They are not API: the rest of the orchestrator uses what
this face exports.
"""

from __future__ import annotations

from elastic_pipe.orchestrator.prefix.frozen import FrozenPrefix, PrefixReport

__all__ = ["FrozenPrefix", "PrefixReport"]
