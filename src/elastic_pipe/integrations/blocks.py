"""Where a model's freezable blocks are: the leading units a freeze policy counts.

A *unit* is what one step of a freeze policy's count covers: one transformer block, and for the first unit also the
embeddings in front of it (they freeze with the first block: nothing below a frozen block may still train, or the
frozen block's output would keep changing). The last module of a unit is its block, whose output the probe of a
probe-driven policy reads.

:func:`find_blocks` tries the adapters of :data:`ADAPTERS` on the model and on each of its submodules, shallowest
first, so a Lightning module holding a Hugging Face model as ``self.model`` is found as well as the bare model:

============================  ===========================  =============================================
family                        blocks                       embeddings (frozen with the first block)
============================  ===========================  =============================================
HF BERT / RoBERTa / ViT / ...  ``<base>.encoder.layer``     ``<base>.embeddings``
HF ViT (transformers >= 5)    ``<base>.layers``            ``<base>.embeddings``
HF GPT-2                      ``transformer.h``            ``transformer.wte``, ``transformer.wpe``
HF Llama / Mistral / Qwen     ``model.layers``             ``model.embed_tokens``
HF DistilBERT                 ``distilbert.transformer.layer``  ``distilbert.embeddings``
torchvision ViT               ``encoder.layers``           ``conv_proj``, ``class_token``, ``encoder.pos_embedding``
============================  ===========================  =============================================

(``<base>`` is the model itself for a bare ``BertModel``, or ``bert``/``vit``/``roberta``/... for a model with a
head.) Anything else: pass a function that lists the blocks (:data:`BlockFn`).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import TypeAlias

from torch import nn

from elastic_pipe.integrations.errors import IntegrationError

__all__ = ["ADAPTERS", "BlockFn", "Blocks", "find_blocks"]

#: A user's block locator: the model -> its blocks in forward order; an entry may be a sequence of modules (the
#: last is the block whose output the probe reads, e.g. ``[model.embeddings, model.layers[0]]``).
BlockFn: TypeAlias = Callable[[nn.Module], Sequence[nn.Module | Sequence[nn.Module]]]


@dataclass(frozen=True)
class Blocks:
    """A model's freeze units, in forward order.

    Attributes:
        units: per unit, its modules; the last one is the block whose output a probe reads.
        where: how they were found (an adapter's name and the path of the submodule it matched, or ``"user"``).
    """

    units: tuple[tuple[nn.Module, ...], ...]
    where: str

    def __post_init__(self) -> None:
        if not self.units or any(not unit for unit in self.units):
            raise IntegrationError(f"Blocks: expected at least one unit, each of >= 1 module, got {self.units!r}")

    def __len__(self) -> int:
        return len(self.units)

    def modules(self, start: int, stop: int) -> list[nn.Module]:
        """Every module of units ``start .. stop - 1`` (what a freeze from ``start`` to ``stop`` covers)."""
        return [m for unit in self.units[start:stop] for m in unit]

    def outputs(self) -> tuple[nn.Module, ...]:
        """Each unit's block (the module whose output is the unit's output)."""
        return tuple(unit[-1] for unit in self.units)


def _get(root: nn.Module, path: str) -> object | None:
    obj: object = root
    for name in path.split("."):
        obj = getattr(obj, name, None)
        if obj is None:
            return None
    return obj


def _as_module(obj: object) -> nn.Module:
    """A module as it is; a bare parameter (a class token, a position embedding) in a holder that yields it."""
    if isinstance(obj, nn.Parameter):
        return nn.ParameterList([obj])
    assert isinstance(obj, nn.Module), obj
    return obj


@dataclass(frozen=True)
class Adapter:
    """One model family: where its blocks are and what freezes with the first block.

    Attributes:
        name: the family.
        blocks: path of the ``nn.ModuleList`` of blocks, relative to the matched module.
        embeddings: paths of the modules or parameters in front of the first block (those present are taken).
        needs: paths that must all be present for the adapter to match (besides ``blocks``).
    """

    name: str
    blocks: str
    embeddings: tuple[str, ...]
    needs: tuple[str, ...] = ()

    def match(self, module: nn.Module) -> tuple[tuple[nn.Module, ...], ...] | None:
        """The units of ``module`` if it has this family's layout, else None."""
        blocks = _get(module, self.blocks)
        if not isinstance(blocks, nn.ModuleList) or len(blocks) == 0:
            return None
        if any(_get(module, need) is None for need in self.needs):
            return None
        front = [_as_module(e) for e in (_get(module, path) for path in self.embeddings) if e is not None]
        if not front:
            return None
        units: list[tuple[nn.Module, ...]] = [(m,) for m in blocks]
        units[0] = (*front, blocks[0])
        return tuple(units)


_HF_ENCODER_BASES = ("bert", "roberta", "vit", "deit", "electra", "xlm_roberta", "camembert", "albert", "beit")

#: The adapters :func:`find_blocks` tries, in order, on each submodule (shallowest first).
ADAPTERS: tuple[Adapter, ...] = (
    Adapter("hf-encoder", "encoder.layer", ("embeddings",)),
    *(Adapter(f"hf-{base}", f"{base}.encoder.layer", (f"{base}.embeddings",)) for base in _HF_ENCODER_BASES),
    # transformers >= 5 keeps some encoders' blocks on the base model itself (ViT: ``vit.layers``)
    Adapter("hf-encoder-flat", "layers", ("embeddings",)),
    *(Adapter(f"hf-{base}-flat", f"{base}.layers", (f"{base}.embeddings",)) for base in _HF_ENCODER_BASES),
    Adapter("hf-distilbert", "transformer.layer", ("embeddings",)),
    Adapter("hf-distilbert-head", "distilbert.transformer.layer", ("distilbert.embeddings",)),
    Adapter("hf-gpt2", "h", ("wte", "wpe")),
    Adapter("hf-gpt2-head", "transformer.h", ("transformer.wte", "transformer.wpe")),
    Adapter("hf-llama", "layers", ("embed_tokens",)),
    Adapter("hf-llama-head", "model.layers", ("model.embed_tokens",)),
    Adapter("torchvision-vit", "encoder.layers", ("conv_proj", "class_token", "encoder.pos_embedding"), ("conv_proj",)),
)


def find_blocks(model: nn.Module, blocks: BlockFn | None = None) -> Blocks:
    """Locate ``model``'s freeze units.

    Args:
        model: the model being trained (a Hugging Face model, a torchvision ViT, or a module holding one).
        blocks: a function listing the blocks instead of the adapters; its first entry should include the
            embeddings (e.g. ``lambda m: [[m.embed, m.blocks[0]], *m.blocks[1:]]``).

    Returns:
        The units, with where they were found.

    Raises:
        IntegrationError: no adapter matches (the message lists the families and asks for ``blocks=``), or the
            user function returned no modules.
    """
    if blocks is not None:
        listed = blocks(model)
        units: list[tuple[nn.Module, ...]] = []
        for i, entry in enumerate(listed):
            parts = (entry,) if isinstance(entry, nn.Module) else tuple(entry)
            if not parts or not all(isinstance(p, nn.Module) for p in parts):
                raise IntegrationError(
                    f"find_blocks: entry {i} of the block function's result is {entry!r}; expected an nn.Module "
                    "or a non-empty sequence of them"
                )
            units.append(parts)
        if not units:
            raise IntegrationError("find_blocks: the block function returned no blocks; expected at least one")
        return Blocks(tuple(units), "user")
    for path, sub in model.named_modules():
        for adapter in ADAPTERS:
            found = adapter.match(sub)
            if found is not None:
                return Blocks(found, f"{adapter.name} at {path or '<model>'}")
    families = sorted({a.name.removesuffix("-flat").removesuffix("-head") for a in ADAPTERS})
    raise IntegrationError(
        f"find_blocks: no known block layout in {type(model).__name__} (tried {families}); pass blocks=<function "
        "model -> its blocks in forward order>"
    )
