"""The cache's configuration: tier budgets and places (:class:`CacheTiers`, from plain numbers or strings like
``"20GiB"``), and what to do about random augmentation."""

from __future__ import annotations

import os
import tempfile
import uuid
from dataclasses import dataclass, field
from enum import StrEnum
from pathlib import Path
from typing import TypeVar

import torch

from elastic_pipe.cache.dtypes import check_storage_dtype
from elastic_pipe.cache.errors import CHECK, CacheError, CacheTypeError
from elastic_pipe.types import MAX_BYTES, ByteSizeError, parse_bytes

__all__ = [
    "Augmentation",
    "CacheConfig",
    "CacheTiers",
    "HostKind",
    "OnRandomAugmentation",
    "default_host_dir",
    "default_name",
    "parse_choice",
]

_SHM = Path("/dev/shm")
#: Longest fingerprint: it is stored in the segment header (4096 bytes with the entry description).
MAX_FINGERPRINT = 256
_E = TypeVar("_E", bound=StrEnum)


class Augmentation(StrEnum):
    """What the data pipeline declares about the frozen prefix's input."""

    #: The same input for a sample every epoch: caching is exact.
    NONE = "none"
    #: A random transform per epoch: one cached output would freeze one epoch's augmentation into all later ones.
    RANDOM = "random"


class OnRandomAugmentation(StrEnum):
    """What the cache does when the pipeline declares random augmentation."""

    #: Refuse to build the cache (the default: a silent accuracy change is worse than a slow run).
    ERROR = "error"
    #: Build it disabled: every get misses, every put is ignored; training recomputes the prefix.
    BYPASS = "bypass"
    #: Opt in: cache ``views`` augmented views per sample; epoch ``e`` reads and writes view ``e % views``.
    VIEWS = "views"


class HostKind(StrEnum):
    """What the host tier is made of."""

    #: Segment files in ``/dev/shm``, mapped by every process of the node that uses the same cache name.
    SHARED = "shared"
    #: Page-locked (pinned) memory private to the process: no sharing, but asynchronous copies to the GPU.
    PINNED = "pinned"


def default_host_dir() -> Path:
    """``/dev/shm`` (memory shared by the node's processes) where it exists, else the temporary directory."""
    return _SHM if _SHM.is_dir() else Path(tempfile.gettempdir())


def default_name() -> str:
    """A segment-file prefix unique to this process and call (nothing is shared unless a name is given)."""
    return f"elastic_pipe-{os.getpid()}-{uuid.uuid4().hex[:12]}"


def parse_choice(kind: type[_E], value: str, what: str) -> _E:
    """``kind(value)``, or a :class:`CacheError` that lists the valid values."""
    try:
        return kind(value)
    except ValueError:
        valid = ", ".join(repr(member.value) for member in kind)
        error = CacheError if isinstance(value, str) else CacheTypeError
        raise error(f"unknown {what} {value!r}; expected one of: {valid}") from None


@dataclass(frozen=True, slots=True)
class CacheConfig:
    """Where the cache keeps entries and how much it may use.

    Attributes:
        num_samples: size of the dataset; sample ids are ``0..num_samples-1``.
        device_budget: bytes of entries kept as tensors on ``device`` (0 disables the tier).
        host_budget: bytes of shared-memory segment files under ``host_dir`` (0 disables the tier).
        disk_budget: bytes of checksummed segment files under ``disk_dir`` (0 disables the tier).
        device: the compute device; reads return tensors there.
        name: prefix of the segment files; processes that pass the same name (and directories) share the host
            and disk tiers. The default is unique to this cache object, so nothing is shared by accident.
        host_dir: directory of the host tier (default ``/dev/shm``).
        disk_dir: directory of the disk tier (required when ``disk_budget > 0``).
        augmentation: what the data pipeline declares (``"none"`` or ``"random"``).
        on_random_augmentation: ``"error"``, ``"bypass"`` or ``"views"`` (see :class:`OnRandomAugmentation`).
        views: number of per-epoch views kept per sample when ``on_random_augmentation == "views"``.
        leader: whether this process deletes and renames the shared segment files (one process per node).
        host_kind: ``"shared"`` (files under ``host_dir``) or ``"pinned"`` (private page-locked memory).
        fingerprint: names the model whose frozen prefix produces the entries (see
            :func:`~elastic_pipe.cache.prefix_fingerprint`); host and disk files carrying another one are
            deleted unread. ``""``: no fingerprint (files of a reused name are then trusted).
        storage_dtype: a narrower floating dtype to store entries in (:func:`~elastic_pipe.cache.stored_dtype`:
            it only ever narrows a floating entry); ``None``: each entry in the dtype it is put in (exact).
    """

    num_samples: int
    device_budget: int = 0
    host_budget: int = 0
    disk_budget: int = 0
    device: torch.device = field(default_factory=lambda: torch.device("cpu"))
    name: str = field(default_factory=default_name)
    host_dir: Path = field(default_factory=default_host_dir)
    disk_dir: Path | None = None
    augmentation: Augmentation = Augmentation.NONE
    on_random_augmentation: OnRandomAugmentation = OnRandomAugmentation.ERROR
    views: int = 1
    leader: bool = True
    fingerprint: str = ""
    host_kind: HostKind = HostKind.SHARED
    storage_dtype: torch.dtype | None = None

    def __post_init__(self) -> None:
        CHECK.int("num_samples", self.num_samples, lo=1)
        for key in ("device_budget", "host_budget", "disk_budget"):
            CHECK.int(key, getattr(self, key), hi=MAX_BYTES)
        CHECK.int("views", self.views, lo=1)
        CHECK.str("name", self.name)
        CHECK.str("fingerprint", self.fingerprint)
        CHECK.instance("device", self.device, str | torch.device)
        CHECK.instance("host_dir", self.host_dir, str | Path)
        if self.disk_dir is not None:
            CHECK.instance("disk_dir", self.disk_dir, str | Path)
        if self.disk_budget > 0 and self.disk_dir is None:
            raise CacheError(f"disk_budget={self.disk_budget} needs a disk_dir; got disk_dir=None")
        if not self.name or "/" in self.name or self.name.startswith("."):
            raise CacheError(f"cache name must be a plain file-name prefix, got {self.name!r}")
        if len(self.fingerprint) > MAX_FINGERPRINT or not self.fingerprint.isprintable():
            raise CacheError(
                f"fingerprint must be at most {MAX_FINGERPRINT} printable characters, got {self.fingerprint!r:.80}"
            )
        if self.views < 1:
            raise CacheError(f"views must be >= 1, got {self.views}")
        check_storage_dtype(self.storage_dtype)
        object.__setattr__(self, "augmentation", parse_choice(Augmentation, self.augmentation, "augmentation"))
        object.__setattr__(
            self,
            "on_random_augmentation",
            parse_choice(OnRandomAugmentation, self.on_random_augmentation, "on_random_augmentation"),
        )
        object.__setattr__(self, "host_kind", parse_choice(HostKind, self.host_kind, "host_kind"))
        object.__setattr__(self, "device", torch.device(self.device))
        object.__setattr__(self, "host_dir", Path(self.host_dir))
        if self.disk_dir is not None:
            object.__setattr__(self, "disk_dir", Path(self.disk_dir))
        if self.augmentation is Augmentation.RANDOM and self.on_random_augmentation is OnRandomAugmentation.ERROR:
            raise CacheError(
                "the data pipeline declares random augmentation, so a cached frozen-prefix output would replay one "
                "epoch's augmentation in every later epoch; pass on_random_augmentation='bypass' to train without "
                "the cache, or on_random_augmentation='views' with views=V to cache V per-epoch views on purpose"
            )
        if self.views > 1 and self.on_random_augmentation is not OnRandomAugmentation.VIEWS:
            raise CacheError(f"views={self.views} needs on_random_augmentation='views'")

    @property
    def enabled(self) -> bool:
        """False when random augmentation is bypassed: the cache then stores and returns nothing."""
        return not (
            self.augmentation is Augmentation.RANDOM and self.on_random_augmentation is OnRandomAugmentation.BYPASS
        )

    @property
    def views_per_sample(self) -> int:
        """Keys per sample: ``views`` when random augmentation is cached as per-epoch views, else 1."""
        views_on = (
            self.augmentation is Augmentation.RANDOM and self.on_random_augmentation is OnRandomAugmentation.VIEWS
        )
        return self.views if views_on else 1


def _check_bytes(name: str, value: object) -> None:
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        error = CacheError if isinstance(value, int) and not isinstance(value, bool) else CacheTypeError
        raise error(f"{name} must be an int >= 0 (bytes), got {value!r}; parse strings with CacheTiers.parse")
    if value > MAX_BYTES:
        raise CacheError(f"{name} must be at most {MAX_BYTES} bytes, got {value}")


@dataclass(frozen=True, slots=True)
class CacheTiers:
    """The tiers of a training run's cache as plain numbers: what a run configuration holds.

    Build a cache from it with :meth:`ActivationCache.from_tiers
    <elastic_pipe.cache.ActivationCache.from_tiers>`, which also checks that the directories are writable.

    Attributes:
        device_bytes: bytes of entries on the compute device (0: no device tier).
        host_bytes: bytes of host memory (0: no host tier).
        disk_dir: directory of the disk tier (``""``: none; required when ``disk_bytes > 0``).
        disk_bytes: bytes of checksummed files under ``disk_dir``.
        host_kind: ``"shared"`` (``/dev/shm`` files shared by the node's ranks) or ``"pinned"`` (private).
        host_dir: directory of a shared host tier (``""``: ``/dev/shm``).

    Example:
        >>> CacheTiers.parse("20GiB", host="64GiB", disk_dir="/scratch/cache", disk="1TB").disk_bytes
        1000000000000
    """

    device_bytes: int
    host_bytes: int = 0
    disk_dir: str = ""
    disk_bytes: int = 0
    host_kind: HostKind = HostKind.SHARED
    host_dir: str = ""

    def __post_init__(self) -> None:
        for name in ("device_bytes", "host_bytes", "disk_bytes"):
            _check_bytes(name, getattr(self, name))
        CHECK.str("disk_dir", self.disk_dir)
        CHECK.str("host_dir", self.host_dir)
        if self.disk_bytes > 0 and not self.disk_dir:
            raise CacheError(f"disk_bytes={self.disk_bytes} needs a disk_dir; got disk_dir=''")
        if self.disk_dir and self.disk_bytes == 0:
            raise CacheError(f"disk_dir={self.disk_dir!r} is given but disk_bytes is 0; set both or neither")
        object.__setattr__(self, "host_kind", parse_choice(HostKind, self.host_kind, "host_kind"))
        if self.host_dir and self.host_kind is HostKind.PINNED:
            raise CacheError(f"host_dir={self.host_dir!r} is for host_kind='shared'; a pinned host tier has no files")

    @classmethod
    def parse(
        cls,
        device: str | int,
        *,
        host: str | int = 0,
        disk_dir: str = "",
        disk: str | int = 0,
        host_kind: str = "shared",
        host_dir: str = "",
    ) -> CacheTiers:
        """Tiers from sizes written as ``"20GiB"``, ``"512MB"`` or plain byte counts (see
        :func:`elastic_pipe.types.parse_bytes`).

        Raises:
            CacheError: a malformed size (naming it), or tiers that do not validate.
        """
        try:
            device_bytes, host_bytes, disk_bytes = parse_bytes(device), parse_bytes(host), parse_bytes(disk)
        except ByteSizeError as exc:
            raise CacheError(str(exc)) from None
        return cls(
            device_bytes=device_bytes,
            host_bytes=host_bytes,
            disk_dir=disk_dir,
            disk_bytes=disk_bytes,
            host_kind=parse_choice(HostKind, host_kind, "host_kind"),
            host_dir=host_dir,
        )

    @property
    def total_bytes(self) -> int:
        """All tiers' budgets together."""
        return self.device_bytes + self.host_bytes + self.disk_bytes
