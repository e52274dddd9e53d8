"""The control-group messages: a transition (rank 0's decision), an abort (a rank's one-line error, sent in place
of the message it owed) and an optimizer-state header (what a source rank's optimizer holds for the parameters it
hands over); one versioned, length-checked, checksummed binary frame for all three (a transition at version 2,
which carries the virtual stages per rank; version 1 still decodes); and the published
50-float PipeTransformer message (legacy codec). Decoding never executes code.

This package imports no other elastic_pipe primitive; it may use :mod:`elastic_pipe.types`.

Example::

    msg = TransitionMessage(epoch=3, step=1200, frozen=4, pipe_len=2, boundaries=(4, 8, 12), microbatches=16,
                            max_cost_at_start=21.3, changed_ranks=(1, 9))
    assert decode(encode(msg)) == msg
    assert isinstance(decode_any(encode(AbortMessage(0, "no feasible partition"))), AbortMessage)
"""

from __future__ import annotations

from elastic_pipe.protocol.abort import MAX_REASON_BYTES, AbortMessage
from elastic_pipe.protocol.codec import (
    MAGIC,
    MAX_MESSAGE_BYTES,
    TRANSITION_VERSION,
    VERSION,
    ControlMessage,
    decode,
    decode_any,
    encode,
)
from elastic_pipe.protocol.describe import describe, describe_legacy, legacy_to_dict, message_to_dict
from elastic_pipe.protocol.errors import ProtocolError, ProtocolTypeError
from elastic_pipe.protocol.legacy import LEGACY_LENGTH, LegacyMessage, decode_legacy, encode_legacy
from elastic_pipe.protocol.message import MAX_GRAD_NORMS, MAX_PIPE_LEN, MAX_RANKS, TransitionMessage
from elastic_pipe.protocol.optimizer_state import (
    DEVICE_TYPES,
    DTYPE_NAMES,
    ENTRY_KINDS,
    MAX_KEY_BYTES,
    MAX_NDIM,
    MAX_STATE_BYTES,
    MAX_STATE_ENTRIES,
    MAX_STATE_PARAMS,
    EntryKind,
    OptimizerStateHeader,
    StateEntry,
)

__all__ = [
    "DEVICE_TYPES",
    "DTYPE_NAMES",
    "ENTRY_KINDS",
    "LEGACY_LENGTH",
    "MAGIC",
    "MAX_GRAD_NORMS",
    "MAX_KEY_BYTES",
    "MAX_MESSAGE_BYTES",
    "MAX_NDIM",
    "MAX_PIPE_LEN",
    "MAX_RANKS",
    "MAX_REASON_BYTES",
    "MAX_STATE_BYTES",
    "MAX_STATE_ENTRIES",
    "MAX_STATE_PARAMS",
    "TRANSITION_VERSION",
    "VERSION",
    "AbortMessage",
    "ControlMessage",
    "EntryKind",
    "LegacyMessage",
    "OptimizerStateHeader",
    "ProtocolError",
    "ProtocolTypeError",
    "StateEntry",
    "TransitionMessage",
    "decode",
    "decode_any",
    "decode_legacy",
    "describe",
    "describe_legacy",
    "encode",
    "encode_legacy",
    "legacy_to_dict",
    "message_to_dict",
]
