"""The transition message: a frozen dataclass, a versioned checksummed binary codec (v1), and the published
50-float PipeTransformer message (legacy codec). Decoding never executes code.

This package imports no other elastic_pipe primitive; it may use :mod:`elastic_pipe.types`.

Example::

    msg = TransitionMessage(epoch=3, step=1200, frozen=4, pipe_len=2, boundaries=(4, 8, 12), microbatches=16,
                            max_cost_at_start=21.3, changed_ranks=(1, 9))
    assert decode(encode(msg)) == msg
"""

from __future__ import annotations

from elastic_pipe.protocol.codec import MAGIC, MAX_MESSAGE_BYTES, VERSION, decode, encode
from elastic_pipe.protocol.describe import describe, describe_legacy, legacy_to_dict, message_to_dict
from elastic_pipe.protocol.errors import ProtocolError
from elastic_pipe.protocol.legacy import LEGACY_LENGTH, LegacyMessage, decode_legacy, encode_legacy
from elastic_pipe.protocol.message import MAX_GRAD_NORMS, MAX_PIPE_LEN, MAX_RANKS, TransitionMessage

__all__ = [
    "LEGACY_LENGTH",
    "MAGIC",
    "MAX_GRAD_NORMS",
    "MAX_MESSAGE_BYTES",
    "MAX_PIPE_LEN",
    "MAX_RANKS",
    "VERSION",
    "LegacyMessage",
    "ProtocolError",
    "TransitionMessage",
    "decode",
    "decode_legacy",
    "describe",
    "describe_legacy",
    "encode",
    "encode_legacy",
    "legacy_to_dict",
    "message_to_dict",
]
