"""The workers' store, authenticated: every value the workers set carries an HMAC tag under the job's key.

The workers' store (the agent's, which torch shares with the workers) carries the gloo/NCCL bootstrap: peer
addresses, NCCL ids. A TCPStore has no authentication, and a forged address crashed a gloo worker (SIGSEGV) in the
adversarial test, so the workers wrap it in :func:`authenticated_store`: every value they set carries an HMAC tag
under a key derived from the job's rendezvous secret (:func:`store_key`, handed to the workers in
:data:`STORE_KEY_ENV` by environment inheritance, never on a command line), and a value read without a valid tag
stops the worker with one line naming the key.

What it does not protect: counters and waits pass through (a forged counter can stall a barrier, not change what a
worker reads), and an old tagged value can be replayed under its own key (the same effect).
"""

from __future__ import annotations

import hashlib
import hmac
from datetime import timedelta
from typing import TYPE_CHECKING, Protocol, cast

if TYPE_CHECKING:
    from torch.distributed.distributed_c10d import Store

__all__ = ["STORE_KEY_ENV", "ForgedValueError", "authenticated_store", "store_key"]

#: The environment variable that hands the workers the key of their store's tags (hex; set by the launcher).
STORE_KEY_ENV = "ELASTIC_PIPE_STORE_KEY"
_TAG_BYTES = hashlib.sha256().digest_size

#: The authenticated stores made in this process, kept alive (see :func:`authenticated_store`).
_LIVE_STORES: list[Store] = []


class _StoreAtRunTime(Protocol):
    """What torch's c10d stores do at run time beyond their type stubs: take bytes values, open a connection of
    their own."""

    def set(self, key: str, value: bytes) -> None: ...

    def clone(self) -> Store: ...


class ForgedValueError(RuntimeError):
    """A value read from the workers' store does not carry this job's tag: another process wrote it."""


def store_key(secret: bytes) -> bytes:
    """The key of the workers' store tags, derived from the job's rendezvous secret (the same on every node)."""
    return hmac.new(secret, b"elastic-pipe workers' store v1", hashlib.sha256).digest()


def authenticated_store(inner: Store, key: bytes) -> Store:
    """``inner`` with every value tagged: ``set`` writes ``tag + value``, ``get`` verifies and strips the tag.

    ``tag = HMAC-SHA256(key, store key + value)``, so a value cannot be forged nor moved to another key. Counters
    (``add``) and waits pass through: a forged counter can stall a barrier, not change what a worker reads.

    Raises (from ``get``):
        ForgedValueError: a value without a valid tag, naming its key.
    """
    from torch.distributed.distributed_c10d import Store  # noqa: PLC0415 (torch loads only when a worker joins)

    raw_inner = cast("_StoreAtRunTime", inner)

    def tag(name: str, value: bytes) -> bytes:
        return hmac.new(key, name.encode() + b"\0" + value, hashlib.sha256).digest()

    class AuthenticatedStore(Store):
        def __init__(self) -> None:
            super().__init__()

        def set(self, name: str, value: str | bytes) -> None:
            data = value.encode() if isinstance(value, str) else bytes(value)
            raw_inner.set(name, tag(name, data) + data)

        def get(self, name: str) -> bytes:
            raw = bytes(inner.get(name))
            data = raw[_TAG_BYTES:]
            if len(raw) < _TAG_BYTES or not hmac.compare_digest(raw[:_TAG_BYTES], tag(name, data)):
                raise ForgedValueError(
                    f"the value under {name!r} in the workers' store is not tagged with this job's key: another "
                    "process wrote to the store"
                )
            return data

        def add(self, name: str, amount: int) -> int:
            return int(inner.add(name, amount))

        def wait(self, names: list[str], timeout: timedelta | None = None) -> None:
            if timeout is None:
                inner.wait(names)
            else:
                inner.wait(names, timeout)

        def check(self, names: list[str]) -> bool:
            return bool(inner.check(names))

        def delete_key(self, name: str) -> bool:
            return bool(inner.delete_key(name))

        def num_keys(self) -> int:
            return int(inner.num_keys())

        def set_timeout(self, timeout: timedelta) -> None:
            inner.set_timeout(timeout)

        def clone(self) -> Store:  # a connection of its own, for a store that wants one
            return authenticated_store(raw_inner.clone(), key)

    store: Store = AuthenticatedStore()
    # torch holds a Python-defined store by its C++ part only: once the Python object is gone, its methods are
    # too ("Not implemented"), so every store made here lives as long as the process.
    _LIVE_STORES.append(store)
    return store
