"""``torchrun ... -m elastic_pipe.orchestrator --config FILE.toml [--result FILE.json]``: one rank of a run.

The script torchrun starts on every rank when you drive torchrun yourself (``elastic-pipe train`` starts the
same function through the elastic agent's Python API).
"""

from __future__ import annotations

from elastic_pipe.orchestrator.worker import main

if __name__ == "__main__":
    raise SystemExit(main())
