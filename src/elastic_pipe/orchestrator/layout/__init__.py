"""The layouts of a run, decided: the first one, the layout rule that makes each next one from the frozen count
(the same pure functions the trainer and the dry run call, so a plan predicts the layouts a run performs), the
compression rules and the stages per rank it applies, and a decision point's decision, broadcast as a message.

Modules: :mod:`.rule` (the layout rule: ``next_layout``, ``decide_units``, ``layout_sequence``, ``with_virtual``),
:mod:`.start` (the first layout, the per-rank memory budget), :mod:`.compression` (the compression rules),
:mod:`.virtual_choice` (the stages per rank of each layout, ``virtual = "auto"``), :mod:`.decision` (a layout as a
:class:`~elastic_pipe.protocol.TransitionMessage` and its broadcast), :mod:`.executor` (a decision point's decide,
and the run's start). They are not API: the rest of the orchestrator uses what this face exports - the rule's
functions, the first layout, the compression rules and ``virtual_rule``,
``layout_from_message`` - except the trainer, which imports the :mod:`.executor` module itself (``initial_state``,
``decide``; called through the module, so a test can wrap them): the executor measures the probe through the
stage, and the face leaves it out so that the parts that only make layouts do not import the stage.

Entering a decided layout (the moves, the freeze, the new stage, the carried cache) is
:mod:`elastic_pipe.orchestrator.apply_transition`, beside this package; the transfer plan it follows and the
holdings it moves are :mod:`elastic_pipe.orchestrator.transition`, whose plan this package's decision reads
(``changed_ranks``).
"""

from __future__ import annotations

from elastic_pipe.orchestrator.layout.compression import (
    COMPRESSION_RULES,
    CompressionRule,
    Halving,
    KeepLength,
    MemoryFit,
)
from elastic_pipe.orchestrator.layout.decision import layout_from_message
from elastic_pipe.orchestrator.layout.rule import (
    decide_units,
    frozen_sublayers,
    layout_sequence,
    next_layout,
    with_virtual,
)
from elastic_pipe.orchestrator.layout.start import MemoryBudget, initial_layout, initial_layout_within, start_layout
from elastic_pipe.orchestrator.layout.virtual_choice import virtual_rule

__all__ = [
    "COMPRESSION_RULES",
    "CompressionRule",
    "Halving",
    "KeepLength",
    "MemoryBudget",
    "MemoryFit",
    "decide_units",
    "frozen_sublayers",
    "initial_layout",
    "initial_layout_within",
    "layout_from_message",
    "layout_sequence",
    "next_layout",
    "start_layout",
    "virtual_rule",
    "with_virtual",
]
