"""Build a transition message, send it through the v1 codec, and read a published 50-float message.

Run: python examples/protocol_roundtrip.py
"""

from __future__ import annotations

from elastic_pipe.protocol import (
    LegacyMessage,
    ProtocolError,
    TransitionMessage,
    decode,
    decode_legacy,
    describe,
    describe_legacy,
    encode,
    encode_legacy,
)


def main() -> None:
    """Round-trip a message, show a corrupted one being refused, decode the published form."""
    msg = TransitionMessage(
        epoch=3,
        step=1200,
        frozen=4,
        pipe_len=2,
        boundaries=(4, 8, 12),
        microbatches=16,
        max_cost_at_start=21.3,
        changed_ranks=(1, 9),
        grad_norms=(0.9, 0.7, 0.4, 0.2),
    )
    data = encode(msg)
    print(f"v1 message: {len(data)} bytes\n{data.hex()}\n")
    assert decode(data) == msg
    print(describe(decode(data)) + "\n")

    corrupted = bytearray(data)
    corrupted[30] ^= 0x01  # one flipped bit in the frozen-layer count
    try:
        decode(bytes(corrupted))
    except ProtocolError as exc:
        print(f"corrupted copy refused: {exc}\n")

    # The published PipeTransformer message, as its logs print it.
    published = encode_legacy(LegacyMessage(4, 4, 21.3, 1, (1, 9), None))
    print(published)
    print(describe_legacy(decode_legacy(published)))


if __name__ == "__main__":
    main()
