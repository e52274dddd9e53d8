"""What moves between ranks when the layout changes: who holds which sub-layers in a layout, the transfer plan
(who sends what to whom, a pure function of the two layouts), the point-to-point exchanges of weights and optimizer
state, and what a rank keeps in memory (materialized, released, the optimizer pointed at what it owns).

Modules: :mod:`.plan` (who holds and owns which sub-layers, the :class:`Transfer` plan, the ranks whose role
changes), :mod:`.moves` (the exchanges: tensors and optimizer state, point to point), :mod:`.holdings` (what a rank
holds, and a transition's transfers run on it). They are not API: the rest of the orchestrator uses what this face
exports - the plan's functions, the holdings' functions and the :mod:`.holdings` module (``hold``,
``point_optimizer``, ``param_groups_by_name``, ``fuse_on_device``; called through the module by the trainer, so a
test can wrap them) - except the frozen prefix's residency, which imports :mod:`.holdings` and :mod:`.moves`
themselves (a released prefix brought back): through this face the orchestrator's modules would stand on one more
floor.

Entering a decided layout (:mod:`elastic_pipe.orchestrator.apply_transition`) stands beside this package, not in
it: it applies the layout message (:mod:`elastic_pipe.orchestrator.layout`), whose decision reads the plan
(``changed_ranks``), so with it inside, this package and ``layout`` would import each other.
"""

from __future__ import annotations

from elastic_pipe.orchestrator.transition import holdings
from elastic_pipe.orchestrator.transition.holdings import (
    assemble,
    hold,
    point_optimizer,
    shared_across_sublayers,
    sublayer_keys,
    transfer,
)
from elastic_pipe.orchestrator.transition.moves import drop_foreign_state
from elastic_pipe.orchestrator.transition.plan import (
    Transfer,
    changed_ranks,
    held_sublayers,
    owned_sublayers,
    plan_transfers,
)

__all__ = [
    "Transfer",
    "assemble",
    "changed_ranks",
    "drop_foreign_state",
    "held_sublayers",
    "hold",
    "holdings",
    "owned_sublayers",
    "plan_transfers",
    "point_optimizer",
    "shared_across_sublayers",
    "sublayer_keys",
    "transfer",
]
