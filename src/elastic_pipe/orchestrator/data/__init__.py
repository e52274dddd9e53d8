"""The data a run trains on, as the orchestrator reads it: the training and evaluation parts (samples held in memory,
or a map-style dataset read through ``DataLoader``\\ s), the epoch cut into steps, and the check of the data before
the first step. The data primitives it builds on (the elastic sampler, the built-in datasets) are
:mod:`elastic_pipe.data`, a separate package: every import names its full path, and the modules here that use the
primitive import it as ``from elastic_pipe import data as edata``, so the two never meet under one name.

Modules: :mod:`.step_data` (the one interface of a part, :class:`StepData`, and its :class:`Batch`),
:mod:`.workload` (what is trained on: samples in memory and their :class:`Split`, the default loss),
:mod:`.dataset_split` (a dataset's part, :class:`DatasetSplit`, and :func:`split_data`, which makes the parts of
either kind), :mod:`.items` (a dataset's items: checked, read and stacked), :mod:`.loader_pool` (a part's loaders,
kept across epochs, and the parts of a list they read side by side), :mod:`.epoch_steps` (the epoch's
steps and the batch sampler over them), :mod:`.data_check` (the check before the first step), :mod:`.text_data`
(tokenised text datasets). They are not API: the rest of the orchestrator uses what this face exports.
"""

from __future__ import annotations

from elastic_pipe.orchestrator.data.data_check import local_failure, raise_first_failure
from elastic_pipe.orchestrator.data.dataset_split import DatasetSplit, close_splits, split_data
from elastic_pipe.orchestrator.data.epoch_steps import (
    ElasticBatchSampler,
    EpochPlan,
    epoch_plan,
    reachable_pipe_lens,
    split_unit,
)
from elastic_pipe.orchestrator.data.step_data import Batch, StepData
from elastic_pipe.orchestrator.data.text_data import bbcnews
from elastic_pipe.orchestrator.data.workload import (
    Data,
    Loss,
    Samples,
    Split,
    Standardization,
    as_data,
    cross_entropy,
    eval_count,
    is_samples,
    num_samples,
    split_samples,
)

__all__ = [
    "Batch",
    "Data",
    "DatasetSplit",
    "ElasticBatchSampler",
    "EpochPlan",
    "Loss",
    "Samples",
    "Split",
    "Standardization",
    "StepData",
    "as_data",
    "bbcnews",
    "close_splits",
    "cross_entropy",
    "epoch_plan",
    "eval_count",
    "is_samples",
    "local_failure",
    "num_samples",
    "raise_first_failure",
    "reachable_pipe_lens",
    "split_data",
    "split_samples",
    "split_unit",
]
