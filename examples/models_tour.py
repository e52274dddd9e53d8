"""A tour of elastic_pipe.models: every preset's sub-layer structure and analytic costs, built on the meta device.

    python examples/models_tour.py

Prints, per preset: sub-layers, freezable units, parameters, forward GFLOPs per sample and the size of the
activation that crosses a pipeline cut (and that the frozen-prefix cache stores) per sample.
"""

from __future__ import annotations

import torch

from elastic_pipe.models import (
    BERT_PRESETS,
    GPT_PRESETS,
    VIT_PRESETS,
    analyze,
    bert_encoder,
    gpt_decoder,
    vit,
)

#: Sequence length used for the text models' costs.
TEXT_TOKENS = 128
MB = 2**20


def _example(name: str) -> torch.Tensor:
    if name in VIT_PRESETS:
        c = VIT_PRESETS[name]
        return torch.empty(1, c.in_channels, c.image_size, c.image_size)
    positions = BERT_PRESETS[name].max_positions if name in BERT_PRESETS else GPT_PRESETS[name].max_positions
    return torch.zeros(1, min(TEXT_TOKENS, positions), dtype=torch.long)


def main() -> None:
    builders = [(n, vit) for n in VIT_PRESETS] + [(n, bert_encoder) for n in BERT_PRESETS]
    builders += [(n, gpt_decoder) for n in GPT_PRESETS]
    print(f"{'preset':<12} {'sub-layers':>10} {'units':>5} {'params':>14} {'GFLOP/sample':>12} {'cut MB/sample':>13}")
    for name, build in builders:
        with torch.device("meta"):
            model = build(name)
            profiles = analyze(model, _example(name))
        params = sum(p.params for p in profiles)
        gflops = sum(p.forward_flops for p in profiles) / 1e9
        # fp32 activation between two blocks (what a cut after block 0 sends, per sample)
        cut = profiles[model.unit_ends[0] - 1]
        cut_mb = cut.output_elements * 4 / MB
        row = f"{name:<12} {model.num_sublayers:>10} {model.num_units:>5} {params:>14,}"
        print(f"{row} {gflops:>12.2f} {cut_mb:>13.3f}")
    print(f"(text models at {TEXT_TOKENS} tokens or their context length if shorter; fp32 activations)")


if __name__ == "__main__":
    main()
