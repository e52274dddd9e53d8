"""Process-group planning and management: pure rank layouts (SPMD and the published PipeTransformer layout),
and a manager that creates the control group and every training group once, with real timeouts.

This package imports no other elastic_pipe primitive; it may use :mod:`elastic_pipe.types`.
"""

from __future__ import annotations

__all__: list[str] = []
