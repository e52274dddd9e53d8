"""Map-style datasets that live outside elastic_pipe, for the tests that train on a user's ``Dataset``."""

from __future__ import annotations

import errno
from typing import Any

import torch
import torch.utils.data

from elastic_pipe.data import load_digits

#: The digits' pixel statistics (a user's transform normalises; the trainer does not).
MEAN, STD = 0.3, 0.4


class Digits(torch.utils.data.Dataset[tuple[torch.Tensor, int]]):
    """``samples`` digits from ``start`` on as ``(image, label)``, normalised by the transform; ``flip``: a random
    horizontal flip per read, declared as random (``random_augmentation``)."""

    def __init__(self, samples: int = 320, flip: bool = False, start: int = 0) -> None:
        d = load_digits()
        self.images, self.labels = d.inputs[start : start + samples], d.labels[start : start + samples]
        self.flip = flip
        self.random_augmentation = flip

    def __len__(self) -> int:
        return int(self.images.shape[0])

    def __getitem__(self, index: int) -> tuple[torch.Tensor, int]:
        x = (self.images[index] - MEAN) / STD
        if self.flip and bool(torch.rand(()) < 0.5):
            x = x.flip(-1)
        return x, int(self.labels[index])


def flipped_digits(samples: int = 320) -> Digits:
    """What ``[data] dataset = "plug_data:flipped_digits"`` builds (called with ``[data] options``)."""
    return Digits(samples, flip=True)


def held_out_digits(samples: int = 160) -> Digits:
    """A validation set of its own: the ``samples`` digits after the 320 that :class:`Digits` trains on."""
    return Digits(samples, start=320)


class Broken(Digits):
    """Digits with one bad item: ``kind`` "shape" (a cropped image), "label" (label 10 of 10 classes) or
    "unreadable" (its file cannot be opened: ``FileNotFoundError``)."""

    def __init__(self, bad: int, kind: str, samples: int = 320) -> None:
        super().__init__(samples)
        self.bad, self.kind = bad, kind

    def __getitem__(self, index: int) -> Any:
        if index == self.bad and self.kind == "unreadable":
            raise FileNotFoundError(errno.ENOENT, "No such file", f"/data/{index}.png")
        x, y = super().__getitem__(index)
        if index == self.bad:
            return (x[..., :7], y) if self.kind == "shape" else (x, 10)
        return x, y


class Raising(Digits):
    """Digits whose item ``bad`` raises ``RuntimeError`` when read (an odd ``bad`` is rank 1's share of the setup
    check on two ranks)."""

    def __init__(self, bad: int, samples: int = 320) -> None:
        super().__init__(samples)
        self.bad = bad

    def __getitem__(self, index: int) -> tuple[torch.Tensor, int]:
        if index == self.bad:
            raise RuntimeError(f"sensor {index} went offline")
        return super().__getitem__(index)


def raising_digits(bad: int = 7, samples: int = 320) -> Raising:
    """What ``[data] dataset = "plug_data:raising_digits"`` builds."""
    return Raising(bad, samples)
