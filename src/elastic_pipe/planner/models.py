"""Per-sub-layer work (FLOPs, parameters, bytes) of a transformer shape from the model catalogue.

The shapes come from :mod:`elastic_pipe.models.catalogue` (:func:`~elastic_pipe.models.catalogue.model_shape`),
where each preset's facts are stated once. A model is described at the granularity the partition solver cuts at:
an embedding, then per transformer block an attention sub-layer and an MLP sub-layer (each with its LayerNorm and
residual, as the package's models are built, :mod:`elastic_pipe.models`), then a head. Each sub-layer's work is
counted per *sample* and split by the kind of kernel that does it, because the kinds run at very different speeds
on a GPU (docs/planner.md, "The cost model", gives the rates):

* dense matrix multiplies (``matmul_flops``),
* the attention core ``softmax(QK^T)V`` (``attention_flops``, a fused flash kernel),
* the ViT patch-embedding convolution (``conv_flops``),
* memory-bound element-wise work: LayerNorm, GELU, residual adds, head transposes (``memory_bytes``).

Activation memory kept for the backward pass follows Korthikanti et al., "Reducing Activation Recomputation in
Large Transformer Models" (2022), with a fused attention kernel (no stored ``s x s`` score matrix): 13 bytes per
token and hidden unit for the attention sub-layer, ``5d + 4f`` per token for the MLP sub-layer, in 16-bit.
"""

from __future__ import annotations

from dataclasses import dataclass

from elastic_pipe.models.catalogue import MODEL_SHAPES, model_shape
from elastic_pipe.planner.errors import CHECK
from elastic_pipe.types import MAX_BYTES, TransformerShape

__all__ = [
    "ACTIVATION_BYTES",
    "MODEL_CONFIGS",
    "ModelConfig",
    "SubLayerWork",
    "model_config",
    "model_work",
]

#: Activations travel and are stored in 16-bit (bf16 autocast).
ACTIVATION_BYTES = 2
#: Input images arrive as fp32 and are cast once to 16-bit.
INPUT_PIXEL_BYTES = 4
#: Element passes over the logits for the loss: write (16-bit), upcast (fp32 read + write), softmax read.
LOGIT_BYTES_PER_ELEMENT = 2 + 4 + 4 + 4
#: Host overhead weight of one sub-layer, in blocks: a block is two sub-layers (the eager host cost is priced per
#: block, :attr:`elastic_pipe.planner.GpuSpec.host_overhead`).
HOST_WEIGHT_PER_SUBLAYER = 0.5

# The planner's former names of the catalogue, kept for the callers that still use them (cli/plan.py,
# benchmarks/gpu/bench_elastic_gpu.py): the same objects, not a second catalogue.
ModelConfig = TransformerShape
MODEL_CONFIGS = MODEL_SHAPES
model_config = model_shape


@dataclass(frozen=True, slots=True)
class SubLayerWork:
    """Device-independent work of one sub-layer for ONE sample, forward pass.

    Attributes:
        name: e.g. ``"block3.attn"``.
        unit: freezable unit the sub-layer belongs to (the embedding belongs to unit 0); ``None`` for the head,
            which is never frozen.
        params: parameter count.
        matmul_flops: dense matrix-multiply FLOPs.
        attention_flops: FLOPs of the attention core (``QK^T`` and ``PV``).
        conv_flops: FLOPs of the patch-embedding convolution.
        memory_bytes: bytes moved by memory-bound element-wise kernels.
        output_bytes: bytes of the sub-layer's output (what crosses a stage boundary or lands in a cache).
        stored_bytes: activation bytes kept for the backward pass.
        host_weight: eager host work, in blocks per pass.
    """

    name: str
    unit: int | None
    params: int
    matmul_flops: float
    attention_flops: float = 0.0
    conv_flops: float = 0.0
    memory_bytes: float = 0.0
    output_bytes: float = 0.0
    stored_bytes: float = 0.0
    host_weight: float = HOST_WEIGHT_PER_SUBLAYER

    def __post_init__(self) -> None:
        CHECK.str("SubLayerWork.name", self.name)
        CHECK.optional_int(f"SubLayerWork({self.name!r}).unit", self.unit)
        CHECK.int(f"SubLayerWork({self.name!r}).params", self.params, hi=MAX_BYTES)
        for key in (
            "matmul_flops",
            "attention_flops",
            "conv_flops",
            "memory_bytes",
            "output_bytes",
            "stored_bytes",
            "host_weight",
        ):
            CHECK.float(f"SubLayerWork({self.name!r}).{key}", getattr(self, key))


def _embedding(c: TransformerShape) -> SubLayerWork:
    t, d, a = c.seq_len, c.hidden, ACTIVATION_BYTES
    if c.family == "vit":
        pixels = c.channels * c.image * c.image
        kernel = c.channels * c.patch * c.patch
        return SubLayerWork(
            "embed",
            0,
            params=kernel * d + d + d + t * d,  # conv weight and bias, class token, position table
            matmul_flops=0.0,
            conv_flops=2.0 * kernel * d * (t - 1),
            # fp32 input read, 16-bit cast written; conv output, flatten/transpose, class-token concat, position add.
            memory_bytes=pixels * (INPUT_PIXEL_BYTES + a) + 6 * t * d * a,
            output_bytes=t * d * a,
            stored_bytes=pixels * a,  # the conv keeps its input for the weight gradient
        )
    # Token, position and segment tables, and BERT's LayerNorm after the embeddings.
    tables = (c.vocab + c.positions + c.type_vocab) * d + (2 * d if c.family == "bert" else 0)
    gathers = 3 if c.family == "bert" else 2
    return SubLayerWork(
        "embed",
        0,
        params=tables,
        matmul_flops=0.0,
        memory_bytes=(gathers + 1 + 2) * t * d * a,  # gathers, sum written, LayerNorm read+write
        output_bytes=t * d * a,
        stored_bytes=2 * t * d * a,
    )


def _attention(c: TransformerShape, block: int) -> SubLayerWork:
    t, d, a = c.seq_len, c.hidden, ACTIVATION_BYTES
    core = 4.0 * t * t * d * (0.5 if c.causal else 1.0)
    return SubLayerWork(
        f"block{block}.attn",
        block,
        params=4 * d * d + 4 * d + 2 * d,  # q, k, v, out projections with biases; LayerNorm
        matmul_flops=8.0 * d * d * t,
        attention_flops=core,
        # LayerNorm (2), q/k/v head split (6), output merge (2), residual add (3) element passes.
        memory_bytes=13 * t * d * a,
        output_bytes=t * d * a,
        stored_bytes=13 * t * d,  # Korthikanti et al. with a fused attention kernel, bytes already 16-bit
    )


def _mlp(c: TransformerShape, block: int) -> SubLayerWork:
    t, d, f, a = c.seq_len, c.hidden, c.ffn, ACTIVATION_BYTES
    return SubLayerWork(
        f"block{block}.mlp",
        block,
        params=2 * d * f + f + d + 2 * d,
        matmul_flops=4.0 * d * f * t,
        memory_bytes=(2 * d + 2 * f + 3 * d) * t * a,  # LayerNorm, GELU read+write, residual add
        output_bytes=t * d * a,
        stored_bytes=(5 * d + 4 * f) * t,
    )


def _head(c: TransformerShape) -> SubLayerWork:
    t, d, a = c.seq_len, c.hidden, ACTIVATION_BYTES
    if c.family == "vit":
        return SubLayerWork(
            "head",
            None,
            params=2 * d + d * c.classes + c.classes,
            matmul_flops=2.0 * d * c.classes,  # only the class token reaches the classifier
            memory_bytes=2 * t * d * a,  # the final LayerNorm runs over every token
            output_bytes=c.classes * 4,
            stored_bytes=2 * t * d,
        )
    dense = d * d + d + 2 * d if c.family == "bert" else 0  # BERT's MLM transform: dense, GELU, LayerNorm
    # The decoder shares the token table in the unpipelined model; a pipeline's last stage holds its own copy.
    decoder = c.vocab * d + (c.vocab if c.family == "bert" else 0)
    return SubLayerWork(
        "head",
        None,
        params=2 * d + dense + decoder,
        matmul_flops=2.0 * (dense + c.vocab * d) * t,
        memory_bytes=(6 * t * d * a if dense else 2 * t * d * a) + t * c.vocab * LOGIT_BYTES_PER_ELEMENT,
        output_bytes=t * c.vocab * a,
        stored_bytes=(6 if dense else 2) * t * d * a + t * c.vocab * a,
    )


def model_work(config: TransformerShape) -> tuple[SubLayerWork, ...]:
    """The model's sub-layers in order: embedding, (attention, MLP) per block, head."""
    CHECK.instance("config", config, TransformerShape)
    blocks = [w for b in range(config.blocks) for w in (_attention(config, b), _mlp(config, b))]
    return (_embedding(config), *blocks, _head(config))
