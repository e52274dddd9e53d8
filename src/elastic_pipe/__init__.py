"""elastic_pipe: freeze converged layers and reshape pipeline+data-parallel training around what still trains.

The toolkit is a set of independent primitives - :mod:`~elastic_pipe.freeze`, :mod:`~elastic_pipe.partition`,
:mod:`~elastic_pipe.schedule`, :mod:`~elastic_pipe.groups`, :mod:`~elastic_pipe.protocol`,
:mod:`~elastic_pipe.cache`, :mod:`~elastic_pipe.data`, :mod:`~elastic_pipe.models` - composed by a thin
orchestrator (:mod:`elastic_pipe.orchestrator`), a planner (:mod:`elastic_pipe.planner`) and the CLI.
"""

from __future__ import annotations

from importlib.metadata import PackageNotFoundError, version

from elastic_pipe.types import ElasticPipeError, LayerCost, Layout

try:
    __version__ = version("elastic-pipe")
except PackageNotFoundError:  # running from a source tree that was never installed
    __version__ = "0.0.0+unknown"

__all__ = [
    "ElasticPipeError",
    "ElasticTrainer",
    "LayerCost",
    "Layout",
    "TrainConfig",
    "__version__",
    "load_exported",
]


def __getattr__(name: str) -> object:
    # The trainer and its config load torch and every primitive; importing them lazily keeps `import elastic_pipe`
    # (and so `elastic-pipe --help`) light.
    if name in ("ElasticTrainer", "TrainConfig"):
        from elastic_pipe import orchestrator  # noqa: PLC0415

        return getattr(orchestrator, name)
    if name == "load_exported":  # an exported model and its preprocessing (elastic-pipe export)
        from elastic_pipe.orchestrator.exported_model import load_exported  # noqa: PLC0415

        return load_exported
    raise AttributeError(f"module 'elastic_pipe' has no attribute {name!r}")
