"""Suite-wide settings.

Torch runs on one thread in the tests: the ops here are tiny, and on a 2-core CI machine intra-op threads only
add contention with the gloo processes that the distributed tests spawn (measured: one small training test 17 s
with default threading vs 0.1 s with one thread on a loaded machine).
"""

from __future__ import annotations

import torch

torch.set_num_threads(1)
