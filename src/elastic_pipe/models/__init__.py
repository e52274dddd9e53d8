"""Models at sub-layer granularity (ViT, BERT-style encoder, GPT-style decoder) and adapters that turn torchvision
and Hugging Face models into ordered sub-layer lists.

This package imports no other elastic_pipe primitive; it may use :mod:`elastic_pipe.types`.
"""

from __future__ import annotations

__all__: list[str] = []
