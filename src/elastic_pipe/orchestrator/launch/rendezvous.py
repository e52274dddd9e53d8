"""An authenticated rendezvous: torch's dynamic rendezvous whose state no process without the job's secret can set.

torch's c10d rendezvous keeps the agents' shared state in a TCPStore, pickled, and every agent unpickles what it
reads there on each keep-alive. A TCPStore has no authentication and answers ``list_keys`` to any client, so any
process that can reach its port - every local user for a store on 127.0.0.1, every host on the network for a
multi-node store - could write a pickle under the rendezvous key and run code in the job's agents.

:class:`AuthenticatedBackend` stores the state with an HMAC-SHA256 tag under a key only the job's agents hold, and
hands the rendezvous nothing to unpickle that does not carry a valid tag: a value that is not base64, is too short,
or whose tag does not verify is ignored (a warning; the agent keeps its last authenticated state and its next
write replaces the forged one). Nothing it reads is unpickled before the tag verifies.

The secret is the job's (:mod:`elastic_pipe.orchestrator.launch.secret`); the workers' store, which carries the
gloo/NCCL bootstrap, is tagged under a key derived from it (:mod:`elastic_pipe.orchestrator.launch.worker_store`).

What it does not protect: the keys the agents keep outside both (torch's rank assignment, as JSON, and its
barrier counters) can still be overwritten by whoever reaches the port, which can make the job fail or stall but
not run code, since nothing of them is unpickled; an old authenticated value can be replayed (the same effect).
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import hmac
import logging
import pickle
import socket
from datetime import timedelta
from typing import TYPE_CHECKING, Protocol, cast

from elastic_pipe.orchestrator.errors import ConfigError
from elastic_pipe.orchestrator.launch.job import AUTH_C10D_BACKEND, LOOPBACK, LOOPBACK_BACKEND
from elastic_pipe.orchestrator.launch.secret import fresh_secret

if TYPE_CHECKING:
    from collections.abc import Callable

    from torch._C._distributed_c10d import TCPStore
    from torch.distributed.distributed_c10d import Store
    from torch.distributed.elastic.rendezvous import RendezvousHandler, RendezvousParameters
    from torch.distributed.elastic.rendezvous.dynamic_rendezvous import DynamicRendezvousHandler, RendezvousBackend

__all__ = [
    "AuthenticatedBackend",
    "forged_states",
    "forget_secret",
    "loopback_store",
    "register_backends",
]

log = logging.getLogger(__name__)

#: Pending connections a store's socket queues (torch's own TCPStore backlog is larger; a node has few agents).
_LISTEN_BACKLOG = 128
#: Seconds the agents wait for each other when the parameters name no timeout.
_DEFAULT_TIMEOUT_S = 120
#: What the key is empty with (torch's c10d backend's sentinel), and the domain the tags are taken over.
_NULL = b"-"
_TAG_BYTES = hashlib.sha256().digest_size
_DOMAIN = b"elastic-pipe rendezvous state v1\0"

#: How many forged rendezvous states each run id's backends met in this process (:func:`forged_states`).
_FORGED: dict[str, int] = {}

#: The secret of each run id launched from this process (the handler creators get only the parameters, and the
#: parameters are logged by torch, so the secret does not travel in them).
_SECRETS: dict[str, bytes] = {}


class _StateStore(Protocol):
    """What torch's c10d stores take at run time beyond their type stubs: bytes in a compare-and-set."""

    def compare_set(self, key: str, expected_value: str | bytes, desired_value: bytes) -> bytes: ...


class AuthenticatedBackend:
    """A rendezvous backend (torch's ``RendezvousBackend``) that keeps its state in a store with an HMAC tag.

    The same protocol as torch's ``C10dRendezvousBackend`` (a compare-and-set on one key; the stored value is the
    token), but the value is ``base64(tag + state)`` with ``tag = HMAC-SHA256(secret, domain + run id + state)``,
    and what does not verify is never handed on: :meth:`get_state` and :meth:`set_state` then answer with the
    last authenticated state (or an empty one) and the forged value as the token, so the rendezvous's next write
    replaces it.

    Args:
        store: the store shared by the job's agents.
        run_id: the job's run id (the key, and part of what the tag covers).
        secret: the job's secret.
        name: the backend's registered name (torch checks a handler's backend has the name it was asked for).
    """

    def __init__(self, store: Store, run_id: str, secret: bytes, name: str) -> None:
        self._store = store
        self._run_id = run_id
        self._secret = secret
        self._name = name
        self._key = "elastic_pipe.rendezvous." + run_id
        self._last: bytes | None = None
        self._forged = 0
        cast("_StateStore", store).compare_set(self._key, "", _NULL)  # creates the key if it is absent

    @property
    def name(self) -> str:
        """The backend's registered name."""
        return self._name

    @property
    def forged(self) -> int:
        """How many values read from the store failed authentication."""
        return self._forged

    def _tag(self, state: bytes) -> bytes:
        return hmac.new(self._secret, _DOMAIN + self._run_id.encode() + b"\0" + state, hashlib.sha256).digest()

    def seal(self, state: bytes) -> bytes:
        """``state`` as it is stored: ``base64(tag + state)``."""
        return base64.b64encode(self._tag(state) + state)

    def open(self, value: bytes) -> bytes | None:
        """The state ``value`` seals, or ``None`` when it is not one sealed with this job's secret and run id."""
        try:
            raw = base64.b64decode(value, validate=True)
        except (binascii.Error, ValueError):
            return None
        tag, state = raw[:_TAG_BYTES], raw[_TAG_BYTES:]
        if len(tag) != _TAG_BYTES or not hmac.compare_digest(tag, self._tag(state)):
            return None
        return state

    def _read(self, value: bytes) -> tuple[bytes, bytes] | None:
        if value == _NULL and self._last is None:
            return None  # no agent wrote a state yet (after one did, none writes the sentinel again: a forgery)
        state = self.open(value)
        if state is None:
            self._forged += 1
            _FORGED[self._run_id] = _FORGED.get(self._run_id, 0) + 1
            if self._forged == 1:
                log.warning(
                    "ignored a rendezvous state not sealed with this job's secret (%d bytes under %r): another "
                    "process wrote to the rendezvous store",
                    len(value),
                    self._key,
                )
            return (self._last if self._last is not None else _empty_state()), value
        self._last = state
        return state, value

    def get_state(self) -> tuple[bytes, bytes] | None:
        """The authenticated state and its token (the stored value), or ``None`` before any agent wrote one."""
        return self._read(self._call(lambda: self._store.get(self._key)))

    def set_state(self, state: bytes, token: object = None) -> tuple[bytes, bytes, bool] | None:
        """Write ``state`` if the store still holds ``token``; returns the state now held, its token, and success."""
        sealed = self.seal(state)
        expected = token if isinstance(token, bytes) else _NULL
        value = self._call(lambda: cast("_StateStore", self._store).compare_set(self._key, expected, sealed))
        result = self._read(value)
        if result is None:
            return None
        return result[0], result[1], value == sealed

    def _call(self, op: Callable[[], bytes]) -> bytes:
        from torch.distributed.elastic.rendezvous import RendezvousConnectionError  # noqa: PLC0415

        try:
            return op()
        except (ValueError, RuntimeError, TimeoutError) as exc:
            raise RendezvousConnectionError(f"the rendezvous store failed: {exc}") from exc


def _empty_state() -> bytes:
    """A fresh rendezvous state, pickled here (what the rendezvous unpickles is always of our own making)."""
    from torch.distributed.elastic.rendezvous.dynamic_rendezvous import _RendezvousState  # noqa: PLC0415

    return pickle.dumps(_RendezvousState())


def loopback_store(timeout_s: float = _DEFAULT_TIMEOUT_S) -> TCPStore:
    """A c10d TCPStore server that listens on :data:`LOOPBACK` only, on a free port.

    torch's TCPStore binds every interface; handed a socket bound here instead, it listens on that one.
    """
    from torch._C._distributed_c10d import TCPStore  # noqa: PLC0415 (torch loads only when a launch starts)

    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    try:
        sock.bind((LOOPBACK, 0))
        sock.listen(_LISTEN_BACKLOG)
        port = int(sock.getsockname()[1])
    except OSError:
        sock.close()
        raise
    fd = sock.detach()  # the store owns the socket from here on
    return TCPStore(
        LOOPBACK,
        port,
        is_master=True,
        multi_tenant=True,
        timeout=timedelta(seconds=timeout_s),
        master_listen_fd=fd,
    )


def _secret_of(params: RendezvousParameters) -> bytes:
    """``params.run_id``'s registered secret; a fresh one for a single node built outside
    :func:`~elastic_pipe.orchestrator.launch.launch`."""
    secret = _SECRETS.get(params.run_id)
    return secret if secret is not None else _SECRETS.setdefault(params.run_id, fresh_secret())


def _timeout(params: RendezvousParameters) -> float:
    return float(params.get_as_int("timeout", _DEFAULT_TIMEOUT_S) or _DEFAULT_TIMEOUT_S)


def _handler(store: Store, backend: AuthenticatedBackend, params: RendezvousParameters) -> DynamicRendezvousHandler:
    """torch's dynamic rendezvous handler over ``backend`` (a ``RendezvousBackend`` by protocol, not by base)."""
    from torch.distributed.elastic.rendezvous.dynamic_rendezvous import create_handler  # noqa: PLC0415

    return create_handler(store, cast("RendezvousBackend", backend), params)


def _create_loopback_handler(params: RendezvousParameters) -> RendezvousHandler:
    """The handler of :data:`LOOPBACK_BACKEND`: authenticated state, both of its stores on loopback."""
    timeout = _timeout(params)
    store = loopback_store(timeout)
    handler = _handler(store, AuthenticatedBackend(store, params.run_id, _secret_of(params), LOOPBACK_BACKEND), params)

    def workers_store(_addr: str, _port: int) -> TCPStore:
        return loopback_store(timeout)

    # The handler starts a second store for the workers (torch >= 2.4 shares it with them) on every interface;
    # build that one on loopback too, through an instance attribute that shadows the method (set with
    # object.__setattr__: typed code cannot assign to a method). The test suite checks that both stores listen on
    # loopback only.
    object.__setattr__(handler, "_create_tcp_store_server", workers_store)
    return handler


def _create_c10d_handler(params: RendezvousParameters) -> RendezvousHandler:
    """The handler of :data:`AUTH_C10D_BACKEND`: torch's c10d store at the endpoint, authenticated state."""
    from torch.distributed.elastic.rendezvous.c10d_rendezvous_backend import _create_tcp_store  # noqa: PLC0415

    secret = _SECRETS.get(params.run_id)
    if secret is None:  # several agents must share it: only launch() knows it
        raise ConfigError(f"no rendezvous secret registered for run id {params.run_id!r} (see register_backends)")
    store = _create_tcp_store(params)
    return _handler(store, AuthenticatedBackend(store, params.run_id, secret, AUTH_C10D_BACKEND), params)


def register_backends(run_id: str, secret: bytes) -> None:
    """Register both backends with torch and remember ``run_id``'s secret for their handlers (this process only)."""
    from torch.distributed.elastic.rendezvous import rendezvous_handler_registry  # noqa: PLC0415

    _SECRETS[run_id] = secret
    rendezvous_handler_registry.register(LOOPBACK_BACKEND, _create_loopback_handler)  # same creator: a no-op
    rendezvous_handler_registry.register(AUTH_C10D_BACKEND, _create_c10d_handler)


def forget_secret(run_id: str) -> None:
    """Drop ``run_id``'s secret (and its forgery count) once its launch is over."""
    _SECRETS.pop(run_id, None)
    _FORGED.pop(run_id, None)


def forged_states(run_id: str) -> int:
    """How many rendezvous states not sealed with ``run_id``'s secret its agent met (and ignored) so far."""
    return _FORGED.get(run_id, 0)
