"""Freeze policies: decide how many leading layers are frozen, collect per-layer gradient statistics,
and apply a decision to a model and its optimizer without disturbing the state of active parameters.

This package imports no other elastic_pipe primitive; it may use :mod:`elastic_pipe.types`.

* :class:`FreezePolicy` - the protocol (monotone: thawing is not supported); built-ins :class:`AlphaSchedule`,
  :class:`PaperRule`, :class:`AutoFreeze`, :class:`Converged`, :class:`Settled`, :class:`Drift`, :class:`FreezeOut`,
  :class:`ManualSchedule`, :class:`Never`; by name with :func:`make_policy` / :data:`POLICIES`.
* :class:`Policy` - a base class giving every member but ``propose`` a documented default; :func:`as_policy`
  completes an object with only ``num_layers`` and ``propose``, or wraps a plain function
  ``(epoch, step, current) -> int`` (:class:`FunctionPolicy`).
* :class:`HeldOutGuard` - the held-out-loss guard of the statistics-driven policies (optionally: wait for a plateau).
* :class:`GradNormTracker` and :class:`LayerStats` - per-layer gradient norms over an interval, per rank;
  :func:`merge_stats` joins the pieces of a pipeline's stages.
* :class:`OutputDrift` and :func:`relative_change` - each layer's output change on a fixed probe batch between
  decision points, the signal of :class:`Drift`.
* :func:`signal_layers` and :func:`needs_probe` - what a runtime must measure for a policy;
  :func:`decisions_per_epoch` - how often it asks to decide. Each reads an optional capability declared as a
  protocol (:class:`SignalCap`, :class:`ProbePolicy`, :class:`DecisionRhythm`): a policy that lacks it gets the
  default (every layer watched, no probe, one decision per epoch).
* :func:`freeze_modules` - frozen parameters leave the optimizer; the others keep their exact state.
* :func:`frozen_by_epoch` - dry-run a schedule-driven policy.
"""

from __future__ import annotations

from elastic_pipe.freeze.alpha import AlphaSchedule, alpha_frozen
from elastic_pipe.freeze.apply import freeze_modules
from elastic_pipe.freeze.autofreeze import AutoFreeze, change_ratios
from elastic_pipe.freeze.base import (
    FunctionPolicy,
    Policy,
    PolicyFunction,
    PolicyLike,
    Proposer,
    as_policy,
    is_policy_function,
)
from elastic_pipe.freeze.converged import Converged
from elastic_pipe.freeze.drift import Drift
from elastic_pipe.freeze.errors import FreezeError, FreezeTypeError
from elastic_pipe.freeze.freezeout import FreezeOut
from elastic_pipe.freeze.guard import HeldOutGuard
from elastic_pipe.freeze.manual import ManualSchedule, Never, parse_manual
from elastic_pipe.freeze.paper import PaperRule
from elastic_pipe.freeze.plan import frozen_by_epoch
from elastic_pipe.freeze.policy import (
    DecisionRhythm,
    FreezePolicy,
    SignalCap,
    decide,
    decisions_per_epoch,
    needs_probe,
    signal_layers,
)
from elastic_pipe.freeze.probe import OutputDrift, ProbePolicy, relative_change
from elastic_pipe.freeze.registry import POLICIES, PolicyFactory, make_policy, register_policy, takes_total_steps
from elastic_pipe.freeze.settled import Settled
from elastic_pipe.freeze.stats import LayerStats, merge_stats
from elastic_pipe.freeze.tracker import GradNormTracker

__all__ = [
    "POLICIES",
    "AlphaSchedule",
    "AutoFreeze",
    "Converged",
    "DecisionRhythm",
    "Drift",
    "FreezeError",
    "FreezeOut",
    "FreezePolicy",
    "FreezeTypeError",
    "FunctionPolicy",
    "GradNormTracker",
    "HeldOutGuard",
    "LayerStats",
    "ManualSchedule",
    "Never",
    "OutputDrift",
    "PaperRule",
    "Policy",
    "PolicyFactory",
    "PolicyFunction",
    "PolicyLike",
    "ProbePolicy",
    "Proposer",
    "Settled",
    "SignalCap",
    "alpha_frozen",
    "as_policy",
    "change_ratios",
    "decide",
    "decisions_per_epoch",
    "freeze_modules",
    "frozen_by_epoch",
    "is_policy_function",
    "make_policy",
    "merge_stats",
    "needs_probe",
    "parse_manual",
    "register_policy",
    "relative_change",
    "signal_layers",
    "takes_total_steps",
]
