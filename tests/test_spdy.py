"""controlplane.spdy: frames written by one side read back by the other with one zlib context per direction, as a
SPDY/3.1 session runs (many header blocks on one stream of compression), and malformed input refused."""

from __future__ import annotations

import hashlib
import struct

import pytest

from controlplane import spdy


def _reader(data: bytes) -> spdy.Reader:
    buf = bytearray(data)

    def recv(n: int) -> bytes:
        out = bytes(buf[:n])
        del buf[:n]
        return out
    return spdy.Reader(recv)


def test_the_dictionary_is_spdy3s() -> None:
    # The 1423 bytes of draft 3's dictionary; a single byte off and no peer can read our header blocks.
    assert len(spdy.DICTIONARY) == 1423
    assert hashlib.sha256(spdy.DICTIONARY).hexdigest() == "51d27341373f923f3cd88e1eb7162aeaa3723d7585ff2399201dc06498407f02"


def test_frames_round_trip_with_one_compression_context() -> None:
    w = spdy.Writer()
    wire = (w.syn_stream(1, {"streamType": "error", "port": "80", "requestID": "0"})
            + w.syn_stream(3, {"streamtype": "data", "port": "80", "requestid": "0"}, fin=False)
            + w.syn_reply(3) + w.data(3, b"hello") + w.data(3, b"", fin=True) + w.ping(7)
            + w.rst_stream(1, spdy.RST_CANCEL) + w.goaway(3))
    r = _reader(wire)
    first, second, reply, data, fin, ping, rst, goaway = (r.read() for _ in range(8))
    assert (first.kind, first.stream_id, first.headers) == (spdy.SYN_STREAM, 1, {"streamtype": "error", "port": "80",
                                                                                "requestid": "0"})
    assert (second.kind, second.headers["streamtype"]) == (spdy.SYN_STREAM, "data")
    assert (reply.kind, reply.stream_id, reply.headers) == (spdy.SYN_REPLY, 3, {})
    assert (data.kind, data.stream_id, data.data, data.fin) == (0, 3, b"hello", False)
    assert (fin.data, fin.fin) == (b"", True)
    assert (ping.kind, ping.ping_id) == (spdy.PING, 7)
    assert (rst.kind, rst.stream_id, rst.status) == (spdy.RST_STREAM, 1, spdy.RST_CANCEL)
    assert (goaway.kind, goaway.stream_id) == (spdy.GOAWAY, 3)
    with pytest.raises(EOFError):
        r.read()


def test_malformed_frames_are_refused() -> None:
    bad_version = struct.pack("!II", 0x80000000 | 2 << 16 | spdy.PING, 4) + b"\0\0\0\1"
    with pytest.raises(spdy.SpdyError, match="SPDY version 2 is not supported"):
        _reader(bad_version).read()
    garbage_headers = struct.pack("!II", 0x80000000 | 3 << 16 | spdy.SYN_REPLY, 8) + b"\0\0\0\1" + b"junk"
    with pytest.raises(spdy.SpdyError, match="does not decompress"):
        _reader(garbage_headers).read()
    with pytest.raises(spdy.SpdyError, match="shorter than its lengths"):
        spdy.decode_headers(struct.pack("!II", 1, 100) + b"x")
