"""The trainer-independent part of the freeze callbacks: a freeze policy driven at its rhythm over a model's blocks.

Both callbacks (:mod:`.transformers`, :mod:`.lightning`) are thin shells around :class:`FreezeController`; it
mirrors ``examples/drift_default_policy.py``, the default policy in a plain loop:

    setup:        blocks = find_blocks(model); policy over len(blocks) units (default: drift, total_steps = the run)
    train start:  probe baseline (a probe-driven policy); the decision before step 0 (a schedule may freeze there)
    every step:   tracker.accumulate()                  (a policy that reads gradient statistics; after backward)
    decision:     observe(stats) / observe_drift(probe) -> freeze.decide -> freeze_modules(new units, optimizer)
                  -> the trainer's DDP wrapper re-wrapped over what still trains (:func:`.ddp.rewrap_ddp`)

Decision points come at the policy's rhythm: a policy that says ``decisions_per_epoch = n`` (drift: 4) decides
every ``steps_per_epoch // n`` optimizer steps, any other after every epoch, as the elastic trainer does;
``decide_every`` overrides it. Under ``torch.distributed`` every rank measures the same signal on identical weights
and rank 0's decision is broadcast, so the ranks never disagree.

The state a resume needs - the policy's snapshot, the frozen count, the probe's baseline outputs and the decisions
so far - is :meth:`FreezeController.state_dict`; restoring it before the first step resumes exactly (the next
decision sees what the uninterrupted run saw), with one limit: a policy that reads gradient statistics restarts its
interval at the resume (the statistics summed since the last decision point are not saved).
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Mapping
from typing import Any, TypeAlias

import torch
import torch.distributed as dist
from torch import nn

from elastic_pipe import freeze
from elastic_pipe.integrations.blocks import BlockFn, Blocks, find_blocks
from elastic_pipe.integrations.errors import IntegrationError
from elastic_pipe.integrations.probe import first_tensor

__all__ = [
    "DEFAULT_POLICY",
    "PROBE_SAMPLES",
    "FreezeController",
    "PolicySpec",
    "decision_interval",
    "expand_optimizer_state",
]

#: The default policy, as the elastic trainer's: drift with its own defaults (docs/freeze.md, "The default policy").
DEFAULT_POLICY = "drift"

#: Samples in the probe batch of a probe-driven policy (the elastic trainer's ``PROBE_SAMPLES``).
PROBE_SAMPLES = 16

#: A policy: a built one, a registry name, or a factory ``(num_units, total_steps) -> policy``.
PolicySpec: TypeAlias = "freeze.FreezePolicy | str | Callable[[int, int], freeze.FreezePolicy] | None"

#: Version of :meth:`FreezeController.state_dict`'s layout.
STATE_VERSION = 1


def decision_interval(policy: freeze.FreezePolicy, steps_per_epoch: int, decide_every: int | None = None) -> int:
    """Optimizer steps between decision points (>= 1).

    ``decide_every`` when given; else every ``steps_per_epoch // n`` steps for a policy with ``decisions_per_epoch
    = n > 1`` (drift: 4), else once per epoch (the published schedules' rhythm).

    Raises:
        IntegrationError: ``decide_every`` or ``steps_per_epoch`` below 1.
    """
    if steps_per_epoch < 1:
        raise IntegrationError(f"decision_interval: steps_per_epoch must be >= 1, got {steps_per_epoch}")
    if decide_every is not None:
        if isinstance(decide_every, bool) or not isinstance(decide_every, int) or decide_every < 1:
            raise IntegrationError(f"decide_every must be an integer >= 1 or None, got {decide_every!r}")
        return decide_every
    n = freeze.decisions_per_epoch(policy)
    if n <= 1:
        return steps_per_epoch
    return max(1, steps_per_epoch // n)


def expand_optimizer_state(
    state: dict[str, Any], groups: list[list[nn.Parameter]], layout: list[list[nn.Parameter]]
) -> dict[str, Any]:
    """An optimizer ``state_dict`` of the current ``groups`` rewritten as if it held every parameter of ``layout``.

    A freeze drops parameters from the optimizer's groups; a trainer that rebuilds its optimizer on resume from
    everything that requires grad (the Hugging Face Trainer does, before any callback runs) then holds more
    parameters than the checkpoint, and loading fails. Saved in the original layout - the frozen parameters listed
    without state - the checkpoint loads into the fresh optimizer, and the callback's restored freeze drops them
    again (:func:`~elastic_pipe.freeze.freeze_modules` deletes no state of what still trains).

    Args:
        state: ``optimizer.state_dict()``; its indices number the parameters of ``groups`` in order.
        groups: the parameters of each param group now.
        layout: the parameters of each param group when training began (a superset of ``groups``, group by group).

    Returns:
        A new state dict; ``state`` is not changed.

    Raises:
        IntegrationError: the group counts differ, or a parameter of ``groups`` is not in its ``layout`` group.
    """
    if len(groups) != len(layout) or len(state["param_groups"]) != len(groups):
        raise IntegrationError(
            f"expand_optimizer_state: {len(groups)} param groups now, {len(layout)} when training began; expected "
            "the same groups (a freeze empties groups, it never removes them)"
        )
    new_index: dict[int, int] = {}
    names: list[dict[int, str]] = []
    for g, params in enumerate(layout):
        for p in params:
            new_index[id(p)] = len(new_index)
        saved_names = state["param_groups"][g].get("param_names")
        names.append({})
        if saved_names is not None:
            names[g] = {id(p): n for p, n in zip(groups[g], saved_names, strict=True)}
    old_to_new: dict[int, int] = {}
    for g, params in enumerate(groups):
        members = {id(p) for p in layout[g]}
        for p in params:
            if id(p) not in members:
                raise IntegrationError(
                    f"expand_optimizer_state: param group {g} holds a parameter of shape {tuple(p.shape)} it did not "
                    "hold when training began"
                )
            old_to_new[len(old_to_new)] = new_index[id(p)]
    param_groups = []
    for g, saved in enumerate(state["param_groups"]):
        group = {**saved, "params": [new_index[id(p)] for p in layout[g]]}
        if "param_names" in saved:
            group["param_names"] = [names[g].get(id(p), f"frozen.{new_index[id(p)]}") for p in layout[g]]
        param_groups.append(group)
    return {
        **state,
        "state": {old_to_new[k]: v for k, v in state["state"].items()},
        "param_groups": param_groups,
    }


def _inner_optimizer(optimizer: Any) -> torch.optim.Optimizer:
    """The torch optimizer inside a trainer's wrapper (accelerate's ``AcceleratedOptimizer``, Lightning's)."""
    # accelerate's wrapper subclasses Optimizer without being one inside: unwrap while there is an inner one
    for _ in range(4):
        inner = getattr(optimizer, "optimizer", None)
        if inner is None or inner is optimizer:
            break
        optimizer = inner
    if not isinstance(optimizer, torch.optim.Optimizer):
        raise IntegrationError(f"expected a torch optimizer (or a wrapper of one), got {type(optimizer).__name__}")
    return optimizer


class FreezeController:
    """A freeze policy applied to a model's leading blocks at the policy's rhythm.

    Args:
        policy: a :class:`~elastic_pipe.freeze.FreezePolicy` over exactly as many units as the model has blocks, a
            registry name (``"drift"``, ``"alpha"``, ...; built with ``policy_options`` and, when it takes one,
            ``total_steps`` = the run's optimizer steps), a factory ``(num_units, total_steps) -> policy``, or None
            for :data:`DEFAULT_POLICY`.
        blocks: a function listing the model's blocks (:data:`~.blocks.BlockFn`); default: the adapters.
        decide_every: optimizer steps between decision points; default: the policy's rhythm.
        policy_options: keyword options for a policy given by name.

    Raises:
        IntegrationError: ``decide_every`` below 1, or ``policy_options`` with a built policy.
    """

    def __init__(
        self,
        policy: PolicySpec = None,
        *,
        blocks: BlockFn | None = None,
        decide_every: int | None = None,
        policy_options: dict[str, Any] | None = None,
    ) -> None:
        if decide_every is not None and (
            isinstance(decide_every, bool) or not isinstance(decide_every, int) or decide_every < 1
        ):
            raise IntegrationError(f"decide_every must be an integer >= 1 or None, got {decide_every!r}")
        if policy_options and not (policy is None or isinstance(policy, str)):
            raise IntegrationError("policy_options apply to a policy given by name; configure a built policy itself")
        self._spec = DEFAULT_POLICY if policy is None else policy
        self._block_fn = blocks
        self._decide_every = decide_every
        self._options = dict(policy_options or {})
        self.policy: freeze.FreezePolicy | None = None
        self.blocks: Blocks | None = None
        self.model: nn.Module | None = None
        self.optimizer: torch.optim.Optimizer | None = None
        self.frozen = 0
        self.every = 0
        self.steps_per_epoch = 0
        self.total_steps = 0
        #: Every decision that froze something: ``{"step", "epoch", "frozen", "previous"}``.
        self.events: list[dict[str, int]] = []
        self._tracker: freeze.GradNormTracker | None = None
        self._drift: freeze.OutputDrift | None = None
        self._probe: Callable[[], object] | None = None
        self._layout: list[list[nn.Parameter]] | None = None
        self._hook: Any = None
        self._pending: dict[str, Any] | None = None
        self._started = False

    # -- setup ---------------------------------------------------------------------------------------------------

    def locate(self, model: nn.Module) -> Blocks:
        """Find ``model``'s blocks (once) and remember the model."""
        if self.blocks is None or self.model is not model:
            self.blocks = find_blocks(model, self._block_fn)
            self.model = model
        return self.blocks

    def build_policy(self, total_steps: int) -> freeze.FreezePolicy:
        """Build the policy over the located blocks (once); ``total_steps`` fills a policy's ``total_steps``.

        Raises:
            IntegrationError: the blocks are not located yet, or a built policy counts a different number of units
                than the model has blocks.
        """
        if self.blocks is None:
            raise IntegrationError("FreezeController.build_policy: locate the model's blocks first")
        if self.policy is not None:
            return self.policy
        units, spec = len(self.blocks), self._spec
        try:
            if isinstance(spec, str):
                options = dict(self._options)
                factory = freeze.POLICIES.get(spec)
                if "total_steps" not in options and factory is not None and freeze.takes_total_steps(factory):
                    options["total_steps"] = max(1, total_steps)
                policy = freeze.make_policy(spec, units, **options)
            elif isinstance(spec, freeze.FreezePolicy):
                policy = spec
            else:
                policy = spec(units, max(1, total_steps))
        except freeze.FreezeError as exc:
            raise IntegrationError(f"freeze policy {spec!r} over {units} blocks: {exc}") from None
        if not isinstance(policy, freeze.FreezePolicy):
            raise IntegrationError(f"freeze policy {spec!r} built {policy!r}, which lacks the FreezePolicy members")
        if policy.num_layers != units:
            raise IntegrationError(
                f"freeze policy {policy.name!r} counts num_layers={policy.num_layers} units, but the model has "
                f"{units} blocks ({self.blocks.where}); expected num_layers={units}"
            )
        self.policy = policy
        if policy.needs_stats:
            self._tracker = freeze.GradNormTracker(
                {i: nn.ModuleList(list(unit)) for i, unit in enumerate(self.blocks.units)}
            )
        return policy

    def set_rhythm(self, steps_per_epoch: int, total_steps: int) -> None:
        """Record the run's length and fix the decision interval (after :meth:`build_policy`)."""
        assert self.policy is not None, "build_policy first"
        self.steps_per_epoch = max(1, steps_per_epoch)
        self.total_steps = max(1, total_steps)
        self.every = decision_interval(self.policy, self.steps_per_epoch, self._decide_every)

    def attach_optimizer(self, optimizer: Any, *, save_full_layout: bool = False) -> None:
        """Take the optimizer the freezes drop parameters from.

        Args:
            optimizer: a torch optimizer or a trainer's wrapper of one.
            save_full_layout: make the optimizer's ``state_dict`` list every parameter it held at this call, the
                frozen ones without state (:func:`expand_optimizer_state`), for a trainer that rebuilds the
                optimizer from every trainable parameter before the callback restores its freeze.
        """
        inner = _inner_optimizer(optimizer)
        if self.optimizer is inner:
            return
        self.optimizer = inner
        if save_full_layout:
            self._layout = [list(g["params"]) for g in inner.param_groups]
            self._hook = inner.register_state_dict_post_hook(self._expand)

    def _expand(self, optimizer: torch.optim.Optimizer, state: dict[str, Any]) -> dict[str, Any]:
        assert self._layout is not None
        groups = [list(g["params"]) for g in optimizer.param_groups]
        return expand_optimizer_state(state, groups, self._layout)

    def set_probe(self, run: Callable[[], object]) -> None:
        """Give the function that runs the model on the probe batch (read by a probe-driven policy)."""
        self._probe = run

    # -- the run -------------------------------------------------------------------------------------------------

    def start(self, *, resumed: bool) -> int | None:
        """At the start of training, after setup (and a restore): apply a restored freeze, take the probe's
        baseline, and - in a fresh run - make the decision before step 0.

        Returns:
            The new frozen count if this froze anything, else None.
        """
        policy = self._need_policy()
        before = self.frozen
        pending, self._pending = self._pending, None
        if pending is not None:
            self._restore(pending)
        if freeze.needs_probe(policy):
            self._drift = freeze.OutputDrift()
            if pending is not None and pending.get("probe") is not None:
                device = next(iter(self.model.parameters())).device if self.model is not None else None
                self._drift.load_state_dict(
                    {int(k): v for k, v in pending["probe"].items()}, num_layers=len(self._units), device=device
                )
            else:
                self._drift.measure(self._probe_outputs(), len(self._units))
        self._started = True
        if not resumed:
            self._decide(step=0)
        return self.frozen if self.frozen > before else None

    def after_backward(self) -> None:
        """Add this step's gradients to the interval's statistics (a policy that reads them; once per optimizer
        step, after the gradients are complete and before they are zeroed)."""
        if self._tracker is not None and self.frozen < len(self._units):
            self._tracker.accumulate()

    def is_decision_point(self, step: int) -> bool:
        """Whether a decision point follows the run's ``step``-th optimizer step."""
        return (
            self._started
            and self.every > 0
            and 0 < step < self.total_steps
            and step % self.every == 0
            and self.frozen < len(self._units)
        )

    def step_end(self, step: int) -> int | None:
        """After optimizer step ``step`` (1-based: steps completed): decide at a decision point.

        Returns:
            The new frozen count if this step's decision froze anything, else None.
        """
        if not self.is_decision_point(step):
            return None
        before = self.frozen
        self._decide(step)
        return self.frozen if self.frozen > before else None

    def observe_eval(self, loss: float) -> None:
        """Hand a held-out loss to the policy (its guard)."""
        if self.policy is not None:
            self.policy.observe_eval(float(loss))

    def _decide(self, step: int) -> None:
        policy = self._need_policy()
        units = len(self._units)
        if self.frozen >= units:
            return
        if self._tracker is not None and step > 0:
            policy.observe(self._tracker.local_stats(units))
            self._tracker.reset()
        if self._drift is not None and step > 0:
            change = freeze.relative_change(*self._drift.measure(self._probe_outputs(), units))
            policy.observe_drift(change)  # type: ignore[attr-defined]  # needs_probe checked it
        epoch = step // self.steps_per_epoch if self.steps_per_epoch else 0
        proposal = freeze.decide(policy, epoch, step, self.frozen)
        proposal = _agree(proposal)
        if proposal > self.frozen:
            self.events.append({"step": step, "epoch": epoch, "frozen": proposal, "previous": self.frozen})
            self._freeze_to(proposal)

    def _freeze_to(self, count: int) -> None:
        blocks = self._need_blocks()
        freeze.freeze_modules(blocks.modules(self.frozen, count), self.optimizer)
        self.frozen = count

    # -- the probe -----------------------------------------------------------------------------------------------

    def _probe_outputs(self) -> dict[int, torch.Tensor]:
        """The outputs of units ``frozen .. watched - 1`` on the probe batch (eval mode, no grad)."""
        policy, blocks, model = self._need_policy(), self._need_blocks(), self.model
        if self._probe is None or model is None:
            raise IntegrationError(
                f"freeze policy {policy.name!r} reads a probe batch, but none was set; give probe= to the callback"
            )
        watched = freeze.signal_layers(policy)
        outputs: dict[int, torch.Tensor] = {}

        def capture(index: int, _module: nn.Module, _args: object, output: object) -> None:
            h = first_tensor(output)
            if h is not None:
                outputs[index] = h.detach()

        handles = [
            block.register_forward_hook(functools.partial(capture, i))
            for i, block in enumerate(blocks.outputs())
            if self.frozen <= i < watched
        ]
        was = model.training
        model.eval()
        try:
            with torch.no_grad():
                self._probe()
        finally:
            for handle in handles:
                handle.remove()
            model.train(was)
        missing = [i for i in range(self.frozen, watched) if i not in outputs]
        if missing:
            raise IntegrationError(
                f"the probe batch's forward did not run blocks {missing} ({blocks.where}); expected every block's "
                "output to be a tensor or a tuple starting with one"
            )
        return outputs

    # -- state ---------------------------------------------------------------------------------------------------

    def state_dict(self) -> dict[str, Any]:
        """Everything a resume needs: the policy's snapshot, the frozen count, the decisions so far and, for a
        probe-driven policy, the probe's baseline outputs (CPU tensors under ``"probe"``; the rest is JSON)."""
        policy = self._need_policy()
        state: dict[str, Any] = {
            "version": STATE_VERSION,
            "policy_name": policy.name,
            "num_units": len(self._units),
            "frozen": self.frozen,
            "policy": policy.state_dict(),
            "events": [dict(e) for e in self.events],
        }
        if self._drift is not None:
            state["probe"] = {str(k): v for k, v in self._drift.state_dict().items()}
        return state

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        """Take a :meth:`state_dict`; it is applied at :meth:`start` (the policy may not be built yet).

        Raises:
            IntegrationError: a snapshot of another layout version.
        """
        if state.get("version") != STATE_VERSION:
            raise IntegrationError(
                f"freeze callback state has version {state.get('version')!r}, expected {STATE_VERSION}"
            )
        self._pending = dict(state)

    @property
    def pending_frozen(self) -> int:
        """The frozen count of a loaded state not yet applied (0 without one)."""
        return int(self._pending["frozen"]) if self._pending is not None else 0

    def apply_pending_freeze(self) -> None:
        """Freeze a loaded state's units now (before the policy is built; :meth:`start` does the rest)."""
        if self._pending is not None and self.pending_frozen > self.frozen:
            self._check_units(self._pending)
            self._freeze_to(self.pending_frozen)

    def _check_units(self, state: Mapping[str, Any]) -> None:
        units = len(self._need_blocks())
        if state.get("num_units") != units:
            raise IntegrationError(
                f"freeze callback state counts {state.get('num_units')!r} blocks, but the model has {units}; "
                "expected the checkpoint of the same model"
            )

    def _restore(self, state: Mapping[str, Any]) -> None:
        policy = self._need_policy()
        self._check_units(state)
        if state.get("policy_name") != policy.name:
            raise IntegrationError(
                f"freeze callback state is of policy {state.get('policy_name')!r}, this run's is {policy.name!r}"
            )
        try:
            policy.load_state_dict(dict(state["policy"]))
        except freeze.FreezeError as exc:
            raise IntegrationError(f"freeze callback state does not fit this run's policy: {exc}") from None
        frozen = int(state["frozen"])
        if frozen > self.frozen:
            self._freeze_to(frozen)
        self.events = [dict(e) for e in state.get("events", [])]

    # -- helpers -------------------------------------------------------------------------------------------------

    @property
    def _units(self) -> tuple[tuple[nn.Module, ...], ...]:
        return self._need_blocks().units

    def _need_blocks(self) -> Blocks:
        if self.blocks is None:
            raise IntegrationError("the freeze callback has not located the model's blocks yet")
        return self.blocks

    def _need_policy(self) -> freeze.FreezePolicy:
        if self.policy is None:
            raise IntegrationError("the freeze callback has not built its policy yet")
        return self.policy


def _agree(proposal: int) -> int:
    """Rank 0's proposal on every rank (all ranks measured the same signal; this keeps them in step regardless)."""
    if not (dist.is_available() and dist.is_initialized()) or dist.get_world_size() == 1:
        return proposal
    box: list[object] = [proposal]
    dist.broadcast_object_list(box, src=0)
    value = box[0]
    assert isinstance(value, int), value
    return value
