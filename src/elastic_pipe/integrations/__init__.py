"""Freeze policies where people already train: callbacks for the Hugging Face ``Trainer`` and PyTorch Lightning.

* :mod:`elastic_pipe.integrations.transformers` - ``FreezeCallback``, a ``transformers.TrainerCallback``
  (``pip install elastic-pipe[transformers]``).
* :mod:`elastic_pipe.integrations.lightning` - ``FreezeCallback``, a Lightning ``Callback``
  (``pip install elastic-pipe[lightning]``).

Both are thin shells around what this package's face exports, which needs neither trainer:

* :class:`FreezeController` - any :class:`~elastic_pipe.freeze.FreezePolicy` (default: ``drift``) at its rhythm
  over a model's leading blocks, its probe, its state for a checkpoint;
* :func:`find_blocks` / :class:`Blocks` - the blocks of HF BERT/ViT/GPT-2/Llama-family models and torchvision's ViT,
  or a user function's;
* :func:`rewrap_ddp` - rebuild a DDP wrapper's reducer over what still trains after a freeze.

The integrations use the primitives (:mod:`elastic_pipe.freeze`), never the orchestrator (tests/test_architecture.py).
docs/integrations.md has the usage.
"""

from __future__ import annotations

from elastic_pipe.integrations.blocks import ADAPTERS, BlockFn, Blocks, find_blocks
from elastic_pipe.integrations.controller import (
    DEFAULT_POLICY,
    PROBE_SAMPLES,
    FreezeController,
    decision_interval,
    expand_optimizer_state,
)
from elastic_pipe.integrations.ddp import reduced_parameters, rewrap_ddp
from elastic_pipe.integrations.errors import IntegrationError

__all__ = [
    "ADAPTERS",
    "DEFAULT_POLICY",
    "PROBE_SAMPLES",
    "BlockFn",
    "Blocks",
    "FreezeController",
    "IntegrationError",
    "decision_interval",
    "expand_optimizer_state",
    "find_blocks",
    "reduced_parameters",
    "rewrap_ddp",
]
