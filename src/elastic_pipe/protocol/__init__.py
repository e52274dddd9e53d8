"""The transition message: a frozen dataclass, a versioned checksummed binary codec (v1), and the published
50-float PipeTransformer message (legacy codec). Decoding never executes code.

This package imports no other elastic_pipe primitive; it may use :mod:`elastic_pipe.types`.
"""

from __future__ import annotations

__all__: list[str] = []
