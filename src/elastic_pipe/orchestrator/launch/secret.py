"""The rendezvous secret of a job: drawn fresh for a single node, given by the user for several.

A single-node job draws a fresh 256-bit secret per launch, held only in the agent's memory (the only process of the
job that meets the rendezvous). A multi-node job must be given one of at least :data:`MIN_SECRET_BITS` bits, the
same on every node, as hex text in a file (``--rdzv-secret-file`` or :data:`SECRET_FILE_ENV`) or in
:data:`SECRET_ENV` - never on a command line, which every local user can read in ``/proc/*/cmdline``.

The secret keys the authenticated rendezvous (:mod:`elastic_pipe.orchestrator.launch.rendezvous`) and, through
:func:`~elastic_pipe.orchestrator.launch.worker_store.store_key`, the workers' store.
"""

from __future__ import annotations

import os
import secrets
import stat
from collections.abc import Mapping

from elastic_pipe.orchestrator.errors import ConfigError

__all__ = [
    "MIN_SECRET_BITS",
    "SECRET_ENV",
    "SECRET_FILE_ENV",
    "fresh_secret",
    "parse_secret",
    "read_secret",
    "secret_for",
]

#: The environment variable that may carry a multi-node job's rendezvous secret (hex).
SECRET_ENV = "ELASTIC_PIPE_RDZV_SECRET"
#: The environment variable that may name a file holding the secret (hex; ``--rdzv-secret-file`` wins).
SECRET_FILE_ENV = "ELASTIC_PIPE_RDZV_SECRET_FILE"
#: The shortest secret accepted: 128 bits, 32 hex digits.
MIN_SECRET_BITS = 128
#: Bytes of a fresh single-node secret (256 bits).
_FRESH_SECRET_BYTES = 32


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
