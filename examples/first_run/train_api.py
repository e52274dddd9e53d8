"""The same run from Python, with objects instead of import paths (docs/first_custom_run.md).

    torchrun --nproc-per-node 2 examples/first_run/train_api.py

Every rank runs this file; ``fit()`` is a collective and returns the same ``RunResult`` on every rank.
"""

from __future__ import annotations

import json
from pathlib import Path

from my_task import OneBlockPerEpoch, train_set, val_set
from safetensors.torch import save_file

from elastic_pipe.orchestrator import ElasticTrainer, load_config
from elastic_pipe.orchestrator.components import build_model


def main(out: str = "runs/first-api", changes: dict[str, object] | None = None) -> dict[str, object]:
    """Train, print the result on rank 0, export the weights; returns the result as plain data.

    Args:
        out: where rank 0 writes ``model.safetensors``.
        changes: ``{"section.key": value}`` over run.toml (the tests shorten the run with them).
    """
    config = load_config(Path(__file__).with_name("run.toml"))
    config = config.override({"checkpoint.dir": "", "log.dir": "", **(changes or {})})
    units = len(build_model(config, meta=True).unit_ends)  # num_layers counts freeze units (blocks)
    policy = OneBlockPerEpoch(units, start=3, most=2)  # or policy=two_from_epoch_four, a function
    with ElasticTrainer(config, data=train_set(), eval_data=val_set(), policy=policy, quiet=True) as trainer:
        result = trainer.fit()
        weights = trainer.full_state_dict()  # a collective too: the whole model on rank 0, {} elsewhere
        if trainer.ctx.rank == 0:  # the rank-0 idiom: print and write once
            Path(out).mkdir(parents=True, exist_ok=True)
            save_file(weights, f"{out}/model.safetensors")
            print(json.dumps({"final_accuracy": result.final_accuracy, "epochs": len(result.epochs)}))
    return result.to_dict()


if __name__ == "__main__":
    main()
