"""An authenticated rendezvous: torch's dynamic rendezvous whose state no process without the job's secret can set.

torch's c10d rendezvous keeps the agents' shared state in a TCPStore, pickled, and every agent unpickles what it
reads there on each keep-alive. A TCPStore has no authentication and answers ``list_keys`` to any client, so any
process that can reach its port - every local user for a store on 127.0.0.1, every host on the network for a
multi-node store - could write a pickle under the rendezvous key and run code in the job's agents.

:class:`AuthenticatedBackend` stores the state with an HMAC-SHA256 tag under a key only the job's agents hold, and
hands the rendezvous nothing to unpickle that does not carry a valid tag: a value that is not base64, is too short,
or whose tag does not verify is ignored (a warning; the agent keeps its last authenticated state and its next
write replaces the forged one). Nothing it reads is unpickled before the tag verifies.

The secret: a single-node job draws a fresh 256-bit one per launch, held only in the agent's memory (the only
process of the job that meets the rendezvous). A multi-node job must be given one of at least
:data:`MIN_SECRET_BITS` bits, the same on every node, as hex text in a file (``--rdzv-secret-file`` or
:data:`SECRET_FILE_ENV`) or in :data:`SECRET_ENV` - never on a command line, which every local user can read in
``/proc/*/cmdline``.

The workers' store (the agent's, which torch shares with the workers) carries the gloo/NCCL bootstrap: peer
addresses, NCCL ids. A forged address crashed a gloo worker (SIGSEGV) in the adversarial test, so the workers wrap
it in :func:`authenticated_store`: every value they set carries an HMAC tag under a key derived from the job's
secret (:func:`store_key`, handed to the workers in :data:`STORE_KEY_ENV` by environment inheritance, never on a
command line), and a value read without a valid tag stops the worker with one line naming the key.

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
import os
import pickle
import secrets
import socket
import stat
from collections.abc import Mapping
from datetime import timedelta
from typing import TYPE_CHECKING, Any

from elastic_pipe.orchestrator.errors import ConfigError

if TYPE_CHECKING:
    from torch.distributed.distributed_c10d import Store
    from torch.distributed.elastic.rendezvous import RendezvousHandler, RendezvousParameters

__all__ = [
    "AUTH_C10D_BACKEND",
    "LOOPBACK",
    "LOOPBACK_BACKEND",
    "MIN_SECRET_BITS",
    "SECRET_ENV",
    "SECRET_FILE_ENV",
    "STORE_KEY_ENV",
    "AuthenticatedBackend",
    "ForgedValueError",
    "authenticated_store",
    "forged_states",
    "forget_secret",
    "fresh_secret",
    "loopback_store",
    "parse_secret",
    "read_secret",
    "register_backends",
    "secret_for",
    "store_key",
]

log = logging.getLogger(__name__)

#: The environment variable that may carry a multi-node job's rendezvous secret (hex).
SECRET_ENV = "ELASTIC_PIPE_RDZV_SECRET"
#: The environment variable that may name a file holding the secret (hex; ``--rdzv-secret-file`` wins).
SECRET_FILE_ENV = "ELASTIC_PIPE_RDZV_SECRET_FILE"
#: The environment variable that hands the workers the key of their store's tags (hex; set by the launcher).
STORE_KEY_ENV = "ELASTIC_PIPE_STORE_KEY"
#: The shortest secret accepted: 128 bits, 32 hex digits.
MIN_SECRET_BITS = 128
#: Bytes of a fresh single-node secret (256 bits).
_FRESH_SECRET_BYTES = 32
#: A single-node job's stores listen here only: no other machine can join or read it.
LOOPBACK = "127.0.0.1"
#: The rendezvous backend registered for single-node jobs: authenticated, on stores bound to :data:`LOOPBACK`.
LOOPBACK_BACKEND = "elastic-pipe-loopback"
#: The rendezvous backend registered for jobs at a given endpoint: authenticated, on torch's c10d TCPStore.
AUTH_C10D_BACKEND = "elastic-pipe-c10d"
#: Pending connections a store's socket queues (torch's own TCPStore backlog is larger; a node has few agents).
_LISTEN_BACKLOG = 128
#: Seconds the agents wait for each other when the parameters name no timeout.
_DEFAULT_TIMEOUT_S = 120
#: What the key is empty with (torch's c10d backend's sentinel), and the domain the tags are taken over.
_NULL = b"-"
_TAG_BYTES = hashlib.sha256().digest_size
_DOMAIN = b"elastic-pipe rendezvous state v1\0"

#: The authenticated stores made in this process, kept alive (see :func:`authenticated_store`).
_LIVE_STORES: list[Any] = []

#: How many forged rendezvous states each run id's backends met in this process (:func:`forged_states`).
_FORGED: dict[str, int] = {}

#: The secret of each run id launched from this process (the handler creators get only the parameters, and the
#: parameters are logged by torch, so the secret does not travel in them).
_SECRETS: dict[str, bytes] = {}


def fresh_secret() -> bytes:
    """A new random 256-bit secret (a single-node job's, per launch)."""
    return secrets.token_bytes(_FRESH_SECRET_BYTES)


def parse_secret(text: str, source: str) -> bytes:
    """The secret ``text`` (hex digits, surrounding whitespace ignored) holds.

    Raises:
        ConfigError: not hex, or shorter than :data:`MIN_SECRET_BITS` bits.
    """
    digits = text.strip()
    try:
        secret = bytes.fromhex(digits)
    except ValueError:
        raise ConfigError(
            f"the rendezvous secret from {source} is not hex digits (got {len(digits)} characters); generate one "
            "with `python -c 'import secrets; print(secrets.token_hex(16))'`"
        ) from None
    if len(secret) * 8 < MIN_SECRET_BITS:
        raise ConfigError(
            f"the rendezvous secret from {source} has {len(secret) * 8} bits, at least {MIN_SECRET_BITS} are needed "
            f"({MIN_SECRET_BITS // 4} hex digits, e.g. `python -c 'import secrets; print(secrets.token_hex(16))'`)"
        )
    return secret


def read_secret(secret_file: str | None = None, environ: Mapping[str, str] | None = None) -> bytes | None:
    """The rendezvous secret the user gave: ``secret_file``, else :data:`SECRET_FILE_ENV`, else :data:`SECRET_ENV`.

    Args:
        secret_file: ``--rdzv-secret-file``, if given.
        environ: the environment (default ``os.environ``).

    Returns:
        The secret's bytes, or ``None`` when none was given.

    Raises:
        ConfigError: an unreadable file, a file other users may read or write, or a secret that is not hex or
            shorter than :data:`MIN_SECRET_BITS` bits.
    """
    env = os.environ if environ is None else environ
    path = secret_file or env.get(SECRET_FILE_ENV) or None
    if path is not None:
        try:
            info = os.stat(path)
            if not stat.S_ISREG(info.st_mode):
                raise ConfigError(f"the rendezvous secret file {path!r} is not a regular file")
            if info.st_mode & (stat.S_IRWXG | stat.S_IRWXO):
                mode = stat.S_IMODE(info.st_mode)
                raise ConfigError(
                    f"the rendezvous secret file {path!r} is open to other users (mode {mode:o}); "
                    f"run `chmod 600 {path}`"
                )
            with open(path, encoding="ascii") as f:
                text = f.read(4096)
        except (OSError, UnicodeDecodeError) as exc:
            raise ConfigError(f"cannot read the rendezvous secret file {path!r}: {exc}") from None
        return parse_secret(text, f"file {path!r}")
    value = env.get(SECRET_ENV)
    return None if value is None else parse_secret(value, f"${SECRET_ENV}")


def secret_for(nnodes: int, given: bytes | None, endpoint: str) -> bytes:
    """The secret a job's rendezvous uses: the given one, else a fresh one for a single node.

    Raises:
        ConfigError: several nodes without a secret (each would draw its own and never meet the others).
    """
    if given is not None:
        return given
    if nnodes > 1:
        raise ConfigError(
            f"a multi-node run ({nnodes} nodes, rendezvous at {endpoint}) needs the same rendezvous secret of at "
            f"least {MIN_SECRET_BITS} bits on every node: --rdzv-secret-file FILE, or the environment variable "
            f"{SECRET_FILE_ENV} (a file) or {SECRET_ENV} (hex, e.g. from `python -c 'import secrets; "
            "print(secrets.token_hex(16))'`)"
        )
    return fresh_secret()


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
        store.compare_set(self._key, "", _NULL)  # type: ignore[arg-type]  # creates the key if it is absent

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

    def _read(self, value: bytes) -> tuple[bytes, Any] | None:
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

    def get_state(self) -> tuple[bytes, Any] | None:
        """The authenticated state and its token, or ``None`` before any agent wrote one."""
        return self._read(self._call("get", self._key))

    def set_state(self, state: bytes, token: Any = None) -> tuple[bytes, Any, bool] | None:
        """Write ``state`` if the store still holds ``token``; returns the state now held, its token, and success."""
        sealed = self.seal(state)
        expected = token if isinstance(token, bytes) else _NULL
        value: bytes = self._call("compare_set", self._key, expected, sealed)
        result = self._read(value)
        if result is None:
            return None
        return result[0], result[1], value == sealed

    def _call(self, op: str, *args: Any) -> Any:
        from torch.distributed.elastic.rendezvous import RendezvousConnectionError  # noqa: PLC0415

        try:
            return getattr(self._store, op)(*args)
        except (ValueError, RuntimeError, TimeoutError) as exc:
            raise RendezvousConnectionError(f"the rendezvous store failed: {exc}") from exc


def _empty_state() -> bytes:
    """A fresh rendezvous state, pickled here (what the rendezvous unpickles is always of our own making)."""
    from torch.distributed.elastic.rendezvous.dynamic_rendezvous import _RendezvousState  # noqa: PLC0415

    return pickle.dumps(_RendezvousState())


def loopback_store(timeout_s: float = _DEFAULT_TIMEOUT_S) -> Store:
    """A c10d TCPStore server that listens on :data:`LOOPBACK` only, on a free port.

    torch's TCPStore binds every interface; handed a socket bound here instead, it listens on that one.
    """
    import torch.distributed as dist  # noqa: PLC0415 (torch loads only when a launch starts)

    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    try:
        sock.bind((LOOPBACK, 0))
        sock.listen(_LISTEN_BACKLOG)
        port = int(sock.getsockname()[1])
    except OSError:
        sock.close()
        raise
    fd = sock.detach()  # the store owns the socket from here on
    store: Store = dist.TCPStore(  # type: ignore[attr-defined]  # exported at run time, not in the stubs
        LOOPBACK,
        port,
        is_master=True,
        multi_tenant=True,
        timeout=timedelta(seconds=timeout_s),
        master_listen_fd=fd,
    )
    return store


def _secret_of(params: RendezvousParameters) -> bytes:
    """``params.run_id``'s registered secret; a fresh one for a single node built outside :func:`launch`."""
    secret = _SECRETS.get(params.run_id)
    return secret if secret is not None else _SECRETS.setdefault(params.run_id, fresh_secret())


def _timeout(params: RendezvousParameters) -> float:
    return float(params.get_as_int("timeout", _DEFAULT_TIMEOUT_S) or _DEFAULT_TIMEOUT_S)


def _create_loopback_handler(params: RendezvousParameters) -> RendezvousHandler:
    """The handler of :data:`LOOPBACK_BACKEND`: authenticated state, both of its stores on loopback."""
    from torch.distributed.elastic.rendezvous.dynamic_rendezvous import create_handler  # noqa: PLC0415

    timeout = _timeout(params)
    store = loopback_store(timeout)
    backend = AuthenticatedBackend(store, params.run_id, _secret_of(params), LOOPBACK_BACKEND)
    handler = create_handler(store, backend, params)  # type: ignore[arg-type]  # a RendezvousBackend by protocol
    # The handler starts a second store for the workers (torch >= 2.4 shares it with them) on every interface;
    # build that one on loopback too. The test suite checks that both stores listen on loopback only.
    handler._create_tcp_store_server = lambda _addr, _port: loopback_store(timeout)  # type: ignore[method-assign,assignment]
    return handler


def _create_c10d_handler(params: RendezvousParameters) -> RendezvousHandler:
    """The handler of :data:`AUTH_C10D_BACKEND`: torch's c10d store at the endpoint, authenticated state."""
    from torch.distributed.elastic.rendezvous.c10d_rendezvous_backend import _create_tcp_store  # noqa: PLC0415
    from torch.distributed.elastic.rendezvous.dynamic_rendezvous import create_handler  # noqa: PLC0415

    secret = _SECRETS.get(params.run_id)
    if secret is None:  # several agents must share it: only launch() knows it
        raise ConfigError(f"no rendezvous secret registered for run id {params.run_id!r} (see register_backends)")
    store = _create_tcp_store(params)
    backend = AuthenticatedBackend(store, params.run_id, secret, AUTH_C10D_BACKEND)
    return create_handler(store, backend, params)  # type: ignore[arg-type]


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
    import torch.distributed as dist  # noqa: PLC0415

    def tag(name: str, value: bytes) -> bytes:
        return hmac.new(key, name.encode() + b"\0" + value, hashlib.sha256).digest()

    class AuthenticatedStore(dist.Store):  # type: ignore[misc,name-defined]  # exported at run time
        def __init__(self) -> None:
            super().__init__()

        def set(self, name: str, value: str | bytes) -> None:
            data = value.encode() if isinstance(value, str) else bytes(value)
            inner.set(name, tag(name, data) + data)  # type: ignore[arg-type]  # bytes are accepted

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
            return authenticated_store(inner.clone(), key)  # type: ignore[attr-defined]

    store: Store = AuthenticatedStore()
    # torch holds a Python-defined store by its C++ part only: once the Python object is gone, its methods are
    # too ("Not implemented"), so every store made here lives as long as the process.
    _LIVE_STORES.append(store)
    return store
