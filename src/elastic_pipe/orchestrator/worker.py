"""What each process runs: build the components a config names, train, checkpoint, report.

``python -m elastic_pipe.orchestrator --config FILE.toml`` is the script torchrun starts on every rank
(:func:`elastic_pipe.orchestrator.launch.launch` starts :func:`entry` for ``elastic-pipe train``); :func:`run_rank`
is the same thing as a function, for a program that already runs under torchrun or
:func:`elastic_pipe.testing.run_distributed`.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import sys
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING

from elastic_pipe.orchestrator.config import TrainConfig, config_from_tables, load_config
from elastic_pipe.orchestrator.launch.worker_status import Heartbeat, reporting_failures
from elastic_pipe.orchestrator.preflight import preflight
from elastic_pipe.orchestrator.trainer import ElasticTrainer

if TYPE_CHECKING:
    from elastic_pipe.models import SubLayerModel
    from elastic_pipe.orchestrator.data import Samples
    from elastic_pipe.orchestrator.report import RunResult

__all__ = ["entry", "main", "run_rank"]


def run_rank(
    config: TrainConfig,
    *,
    model: SubLayerModel | None = None,
    samples: Samples | None = None,
    quiet: bool = False,
) -> RunResult:
    """Train on this rank from a config (a collective: every rank of the job calls it with the same arguments).

    The components the config names are built in this process (:func:`components_from_config`), so import paths
    (``"my_pkg.policies:Plateau"``) resolve in every worker.

    Args:
        config: the run (run :func:`elastic_pipe.orchestrator.preflight` first for a clear error before any
            process starts).
        model: a :class:`~elastic_pipe.models.SubLayerModel` seeded identically on every rank; default: the
            config's model.
        samples: the dataset (inputs, labels, sample_ids); default: the config's dataset.
        quiet: no human lines on stderr (records still go to the log files).

    Returns:
        The run's result (the same numbers on every rank).
    """
    with ElasticTrainer(config, model=model, data=samples, quiet=quiet) as trainer, reporting_failures():
        return trainer.fit()  # a failure is reported before the trainer tears down its groups


def entry(tables: Mapping[str, object]) -> dict[str, object]:
    """A picklable entry point for ``elastic_launch``: run this rank from the config's tables, return the result.

    The launcher learns of a failure when it is caught, and of a worker that stops responding, through
    :mod:`.worker_status`.
    """
    with reporting_failures():
        config = config_from_tables(tables)
    with Heartbeat(config.launch.timeout), reporting_failures():
        return run_rank(config).to_dict()


def main(argv: Sequence[str] | None = None) -> int:
    """``python -m elastic_pipe.orchestrator --config FILE.toml [--result FILE.json]``."""
    parser = argparse.ArgumentParser(prog="python -m elastic_pipe.orchestrator")
    parser.add_argument("--config", required=True, help="TOML training configuration")
    parser.add_argument("--result", help="rank 0 writes the run's result here as JSON")
    args = parser.parse_args(argv)
    logging.basicConfig(stream=sys.stderr, level=logging.WARNING)
    config = load_config(args.config)
    preflight(config)
    result = run_rank(config)
    if args.result and int(os.environ.get("RANK", "0")) == 0:
        with open(args.result, "w", encoding="utf-8") as f:
            json.dump(result.to_dict(), f)
    return 0
