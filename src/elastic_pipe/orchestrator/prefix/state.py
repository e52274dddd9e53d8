"""Whether the frozen prefix's weights are released, and the evaluation outputs kept while they are: the one
value the run's context holds about the prefix (:attr:`.context.RunContext.prefix`), changed by
:mod:`.residency` and read by the evaluation and the probe. A leaf module: it imports nothing of the
orchestrator."""

from __future__ import annotations

from dataclasses import dataclass

import torch

__all__: list[str] = []  # internal: the package face exports what others use


@dataclass
class PrefixState:
    """Whether the frozen prefix is released, and the evaluation split's prefix outputs while it is.

    Attributes:
        released: leading sub-layers whose weights the stage-0 ranks released (0: resident); the same on every
            rank.
        eval_frozen: the boundary ``eval_values`` belong to.
        eval_values: on stage-0 ranks while released, the prefix output at ``eval_frozen`` of every evaluation
            sample, by position (``None`` otherwise): in device memory when the activation cache keeps entries
            there (they are a few percent of the training entries' bytes, and a transition carries them in place),
            else in host memory (page-locked with a GPU), :func:`.residency.eval_home`.
    """

    released: int = 0
    eval_frozen: int = 0
    eval_values: torch.Tensor | None = None

    def eval_rows(self, positions: torch.Tensor, device: torch.device) -> torch.Tensor:
        """The evaluation outputs of the samples at ``positions`` (of the evaluation split), on ``device``."""
        values = self.eval_values
        assert values is not None, "no evaluation outputs are kept: the prefix is resident"
        return values.index_select(0, positions.to(values.device, torch.int64)).to(device, non_blocking=True)

    @property
    def eval_bytes(self) -> int:
        """Bytes of host memory the evaluation outputs take on this rank."""
        v = self.eval_values
        return 0 if v is None else v.numel() * v.element_size()

    def forget(self) -> None:
        """The prefix is resident again: drop the evaluation outputs."""
        self.released, self.eval_frozen, self.eval_values = 0, 0, None
