"""Atheris harness: OTLP protobuf and JSON decoders raise nothing but ``DecodeError``.

Run: ``python tests/reliability/atheris_decode.py -runs=20000 -seed=7``. The first input
byte picks the decoder; accepted batches must satisfy
``tests.reliability.test_decoder_fuzz.check_batch``.
"""

from __future__ import annotations

import sys

import atheris

with atheris.instrument_imports():
    from loopwatch.collector.decode import decode_json, decode_protobuf
    from loopwatch.collector.errors import DecodeError

from tests.reliability.test_decoder_fuzz import check_batch


def one_input(data: bytes) -> None:
    if not data:
        return
    decoder = decode_json if data[0] & 1 else decode_protobuf
    try:
        batch = decoder(data[1:])
    except DecodeError:
        return
    check_batch(batch)


if __name__ == "__main__":
    atheris.Setup(sys.argv, one_input)
    atheris.Fuzz()
