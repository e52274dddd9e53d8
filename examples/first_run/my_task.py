"""Your own data and freeze policy, for docs/first_custom_run.md: a map-style ``Dataset``, a policy class and a
policy function. ``run.toml`` beside this file names them by import path (``"my_task:..."``); ``train_api.py``
passes them as objects."""

from __future__ import annotations

import torch
import torch.utils.data

from elastic_pipe import freeze
from elastic_pipe.data import load_digits

#: Pixel statistics of the training images, fixed once: the dataset normalises with them, and so must inference.
MEAN, STD = 0.30, 0.40


def preprocess(image: torch.Tensor) -> torch.Tensor:
    """Raw 8x8 pixels in [0, 1] -> the model's input (what training read, so what inference must feed)."""
    return (image - MEAN) / STD


class Digits(torch.utils.data.Dataset[tuple[torch.Tensor, int]]):
    """The 8x8 digits as ``(image, label)`` pairs: items ``start:stop`` of the 1,797, read one at a time."""

    def __init__(self, start: int = 0, stop: int = 1400) -> None:
        d = load_digits()
        self.images, self.labels = d.inputs[start:stop], d.labels[start:stop]

    def __len__(self) -> int:
        return int(self.images.shape[0])

    def __getitem__(self, index: int) -> tuple[torch.Tensor, int]:
        return preprocess(self.images[index]), int(self.labels[index])


def train_set() -> Digits:
    """``[data] dataset = "my_task:train_set"``: the first 1,400 digits."""
    return Digits(0, 1400)


def val_set() -> Digits:
    """``[data] eval_dataset = "my_task:val_set"``: the other 397, never trained on."""
    return Digits(1400, 1797)


class OneBlockPerEpoch(freeze.Policy):
    """From epoch ``start`` on, freeze one more leading block per epoch, at most ``most``. Only ``propose`` is
    written: ``freeze.Policy`` gives ``name``, ``needs_stats``, ``observe``, ``observe_eval``, ``state_dict`` and
    ``load_state_dict`` their defaults."""

    def __init__(self, num_layers: int, start: int = 3, most: int = 2) -> None:
        super().__init__(num_layers)
        self.start, self.most = start, most

    def propose(self, epoch: int, step: int, current: int) -> int:
        wanted = max(0, epoch - self.start + 1)
        return max(current, min(wanted, self.most, self.num_layers))


def two_from_epoch_four(epoch: int, step: int, current: int) -> int:
    """A policy as a plain function: two blocks frozen from epoch 4 on (counted from 0)."""
    return max(current, 2 if epoch >= 4 else 0)
