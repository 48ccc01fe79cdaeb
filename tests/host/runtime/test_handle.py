"""obmm.handle: the handle wire format (encode/decode, corruption detection, JSON)."""

from __future__ import annotations

import dataclasses
import json
import struct
import zlib
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from obmm.handle import HANDLE_MAGIC, HANDLE_SIZE, HANDLE_VERSION, Handle, HandleError

U8 = st.integers(0, 2**8 - 1)
U16 = st.integers(0, 2**16 - 1)
U32 = st.integers(0, 2**32 - 1)
U64 = st.integers(0, 2**64 - 1)
S32 = st.integers(-(2**31), 2**31 - 1)
EID = st.binary(min_size=16, max_size=16)

handles = st.builds(
    Handle,
    mem_id=U64,
    tokenid=U32,
    length=U64,
    uba=U64,
    seid=EID,
    deid=EID,
    scna=U32,
    dcna=U32,
    pxm_numa=S32,
    base_dist=U8,
    node_id=U16,
)

# Every field holds a distinct byte pattern so a swapped or shifted field shows in the golden.
GOLDEN_HANDLE = Handle(
    mem_id=0x0102030405060708,
    tokenid=0x31323334,
    length=0x1112131415161718,
    uba=0x2122232425262728,
    seid=bytes(range(0xA0, 0xB0)),
    deid=bytes(range(0xB0, 0xC0)),
    scna=0x41424344,
    dcna=0x51525354,
    pxm_numa=-2,
    base_dist=0x71,
    node_id=0x6162,
)
GOLDEN_BYTES = bytes.fromhex(
    "4f424d48"  # 0  magic "OBMH"
    "0100"  # 4  version 1
    "5800"  # 6  total_len 88
    "0807060504030201"  # 8  mem_id
    "1817161514131211"  # 16 length
    "2827262524232221"  # 24 uba
    "34333231"  # 32 tokenid
    "44434241"  # 36 scna
    "54535251"  # 40 dcna
    "feffffff"  # 44 pxm_numa -2
    "a0a1a2a3a4a5a6a7a8a9aaabacadaeaf"  # 48 seid
    "b0b1b2b3b4b5b6b7b8b9babbbcbdbebf"  # 64 deid
    "6261"  # 80 node_id
    "71"  # 82 base_dist
    "00"  # 83 reserved
    "3bdaa867"  # 84 crc32 0x67a8da3b
)


def _replace(field: str, value: object) -> Handle:
    changes: dict[str, Any] = {field: value}
    return dataclasses.replace(GOLDEN_HANDLE, **changes)


def _reseal(buf: bytes) -> bytes:
    """Recompute the CRC so a test reaches the check after it."""
    return buf[:84] + struct.pack("<I", zlib.crc32(buf[:84]))


def _with_header(buf: bytes, *, version: int | None = None, total_len: int | None = None) -> bytes:
    magic, ver, tl = struct.unpack_from("<4sHH", buf)
    head = struct.pack(
        "<4sHH", magic, ver if version is None else version, tl if total_len is None else total_len
    )
    return head + buf[8:]


# -- layout -----------------------------------------------------------------------------------


def test_handle_size_is_the_documented_88_bytes() -> None:
    assert HANDLE_SIZE == 88
    assert len(GOLDEN_HANDLE.encode()) == HANDLE_SIZE


def test_golden_vector_encodes_byte_exact() -> None:
    assert GOLDEN_HANDLE.encode() == GOLDEN_BYTES


def test_golden_vector_decodes() -> None:
    assert Handle.decode(GOLDEN_BYTES) == GOLDEN_HANDLE


def test_crc_is_zlib_crc32_of_the_first_84_bytes() -> None:
    (crc,) = struct.unpack_from("<I", GOLDEN_BYTES, 84)
    assert crc == zlib.crc32(GOLDEN_BYTES[:84]) == 0x67A8DA3B


def test_decode_accepts_bytearray_and_memoryview() -> None:
    assert Handle.decode(bytearray(GOLDEN_BYTES)) == GOLDEN_HANDLE
    assert Handle.decode(memoryview(GOLDEN_BYTES)) == GOLDEN_HANDLE


# -- round trips ------------------------------------------------------------------------------


@given(handles)
def test_binary_round_trip(h: Handle) -> None:
    buf = h.encode()
    assert len(buf) == HANDLE_SIZE
    assert Handle.decode(buf) == h


@given(handles)
def test_json_round_trip(h: Handle) -> None:
    assert Handle.from_json(h.to_json()) == h
    assert Handle.from_json(h.to_json(indent=2).encode()) == h


def test_extreme_values_round_trip() -> None:
    for lo in (True, False):
        h = Handle(
            mem_id=0 if lo else 2**64 - 1,
            tokenid=0 if lo else 2**32 - 1,
            length=0 if lo else 2**64 - 1,
            uba=0 if lo else 2**64 - 1,
            seid=bytes(16) if lo else b"\xff" * 16,
            deid=bytes(16) if lo else b"\xff" * 16,
            scna=0 if lo else 2**32 - 1,
            dcna=0 if lo else 2**32 - 1,
            pxm_numa=-(2**31) if lo else 2**31 - 1,
            base_dist=0 if lo else 255,
            node_id=0 if lo else 2**16 - 1,
        )
        assert Handle.decode(h.encode()) == h


# -- corruption -------------------------------------------------------------------------------


def test_every_single_bit_flip_is_rejected() -> None:
    for byte in range(HANDLE_SIZE):
        for bit in range(8):
            buf = bytearray(GOLDEN_BYTES)
            buf[byte] ^= 1 << bit
            with pytest.raises(HandleError):
                Handle.decode(bytes(buf))


def test_bit_flip_in_body_reports_crc_mismatch() -> None:
    buf = bytearray(GOLDEN_BYTES)
    buf[20] ^= 0x04
    with pytest.raises(HandleError, match=r"^handle CRC mismatch: stored 0x67a8da3b, computed "):
        Handle.decode(bytes(buf))


def test_every_truncation_is_rejected() -> None:
    for n in range(HANDLE_SIZE):
        with pytest.raises(HandleError, match=r"^truncated handle: got \d+ bytes") as exc:
            Handle.decode(GOLDEN_BYTES[:n])
        if n < 8:
            assert str(exc.value) == (
                f"truncated handle: got {n} bytes, need at least 8 for the header"
            )
        else:
            assert str(exc.value) == f"truncated handle: got {n} bytes, length field says 88"


def test_trailing_bytes_are_rejected() -> None:
    with pytest.raises(HandleError) as exc:
        Handle.decode(GOLDEN_BYTES + b"\x00\x00\x00")
    assert str(exc.value) == "3 trailing bytes after handle: got 91 bytes, length field says 88"


def test_length_field_smaller_than_handle_is_rejected() -> None:
    buf = _reseal(_with_header(GOLDEN_BYTES, total_len=84))
    with pytest.raises(HandleError) as exc:
        Handle.decode(buf[:84])
    assert str(exc.value) == "handle length field is 84, version 1 handles are 88 bytes"


def test_length_field_larger_than_buffer_is_truncation() -> None:
    buf = _reseal(_with_header(GOLDEN_BYTES, total_len=96))
    with pytest.raises(HandleError) as exc:
        Handle.decode(buf)
    assert str(exc.value) == "truncated handle: got 88 bytes, length field says 96"


def test_length_field_mismatch_with_matching_buffer_is_rejected() -> None:
    buf = _reseal(_with_header(GOLDEN_BYTES, total_len=92)) + b"\x00" * 4
    with pytest.raises(HandleError) as exc:
        Handle.decode(buf)
    assert str(exc.value) == "handle length field is 92, version 1 handles are 88 bytes"


def test_wrong_magic_is_rejected() -> None:
    buf = _reseal(b"OBMX" + GOLDEN_BYTES[4:])
    with pytest.raises(HandleError) as exc:
        Handle.decode(buf)
    assert str(exc.value) == "not an obmm handle: bad magic b'OBMX' (expected b'OBMH')"


def test_newer_version_asks_for_an_upgrade() -> None:
    # A newer version is reported as such even if its size and CRC differ from v1's.
    buf = _with_header(GOLDEN_BYTES, version=2, total_len=120)
    with pytest.raises(HandleError) as exc:
        Handle.decode(buf)
    assert str(exc.value) == (
        "handle version 2 is newer than this obmm (supports 1); upgrade obmm-testbed"
    )


def test_version_zero_is_invalid() -> None:
    buf = _reseal(_with_header(GOLDEN_BYTES, version=0))
    with pytest.raises(HandleError) as exc:
        Handle.decode(buf)
    assert str(exc.value) == "handle version 0 is invalid (this obmm supports 1)"


def test_nonzero_reserved_byte_is_rejected() -> None:
    buf = bytearray(GOLDEN_BYTES)
    buf[83] = 0x80
    with pytest.raises(HandleError) as exc:
        Handle.decode(_reseal(bytes(buf)))
    assert str(exc.value) == "handle reserved byte is 0x80, must be 0"


def test_handle_error_is_a_value_error() -> None:
    assert issubclass(HandleError, ValueError)
    assert HANDLE_MAGIC == b"OBMH"
    assert HANDLE_VERSION == 1


# -- field validation -------------------------------------------------------------------------

_RANGES = [
    ("mem_id", 0, 2**64 - 1),
    ("tokenid", 0, 2**32 - 1),
    ("length", 0, 2**64 - 1),
    ("uba", 0, 2**64 - 1),
    ("scna", 0, 2**32 - 1),
    ("dcna", 0, 2**32 - 1),
    ("pxm_numa", -(2**31), 2**31 - 1),
    ("base_dist", 0, 255),
    ("node_id", 0, 2**16 - 1),
]


@pytest.mark.parametrize(("field", "lo", "hi"), _RANGES)
def test_out_of_range_int_field_raises_value_error(field: str, lo: int, hi: int) -> None:
    for bad in (lo - 1, hi + 1):
        with pytest.raises(ValueError) as exc:
            _replace(field, bad)
        assert str(exc.value) == f"Handle.{field} = {bad} is out of range [{lo}, {hi}]"
        assert not isinstance(exc.value, HandleError)


@pytest.mark.parametrize("field", ["seid", "deid"])
def test_eid_of_wrong_size_raises_value_error(field: str) -> None:
    for size in (0, 15, 17):
        with pytest.raises(ValueError) as exc:
            _replace(field, bytes(size))
        assert str(exc.value) == f"Handle.{field} must be exactly 16 bytes, got {size}"


@pytest.mark.parametrize(
    ("field", "value", "message"),
    [
        ("mem_id", True, "Handle.mem_id must be an int, got bool"),
        ("tokenid", 1.0, "Handle.tokenid must be an int, got float"),
        ("node_id", "1", "Handle.node_id must be an int, got str"),
        ("seid", "00" * 16, "Handle.seid must be bytes, got str"),
        ("deid", bytearray(16), "Handle.deid must be bytes, got bytearray"),
    ],
)
def test_wrong_field_type_raises_type_error(field: str, value: object, message: str) -> None:
    with pytest.raises(TypeError) as exc:
        _replace(field, value)
    assert str(exc.value) == message


def test_handle_is_frozen() -> None:
    with pytest.raises(dataclasses.FrozenInstanceError):
        GOLDEN_HANDLE.mem_id = 2  # type: ignore[misc]


# -- JSON -------------------------------------------------------------------------------------


def test_json_shape_uses_hex_eids() -> None:
    doc = json.loads(GOLDEN_HANDLE.to_json())
    assert doc == {
        "format": "obmm-handle",
        "version": 1,
        "mem_id": 0x0102030405060708,
        "tokenid": 0x31323334,
        "length": 0x1112131415161718,
        "uba": 0x2122232425262728,
        "seid": "a0a1a2a3a4a5a6a7a8a9aaabacadaeaf",
        "deid": "b0b1b2b3b4b5b6b7b8b9babbbcbdbebf",
        "scna": 0x41424344,
        "dcna": 0x51525354,
        "pxm_numa": -2,
        "base_dist": 0x71,
        "node_id": 0x6162,
    }


def _doc(**changes: Any) -> str:
    doc = GOLDEN_HANDLE.to_dict()
    for key, value in changes.items():
        if value is None:
            del doc[key]
        else:
            doc[key] = value
    return json.dumps(doc)


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("[1, 2]", "handle JSON must be an object, got list"),
        (
            _doc(format="other"),
            "not an obmm handle document: format is 'other', expected 'obmm-handle'",
        ),
        (
            _doc(version=2),
            "handle version 2 is newer than this obmm (supports 1); upgrade obmm-testbed",
        ),
        (_doc(version=0), "handle JSON has invalid version 0"),
        (_doc(mem_id=None, uba=None), "handle JSON is missing field(s): mem_id, uba"),
        (_doc(extra=1), "handle JSON has unknown field(s): extra"),
        (_doc(seid=5), "handle JSON field seid must be a hex string"),
        (_doc(deid="zz"), "handle JSON field deid is not valid hex: 'zz'"),
        (_doc(seid="00" * 15), "handle JSON: Handle.seid must be exactly 16 bytes, got 15"),
        (_doc(tokenid=-1), "handle JSON: Handle.tokenid = -1 is out of range [0, 4294967295]"),
        (_doc(node_id="1"), "handle JSON: Handle.node_id must be an int, got str"),
    ],
)
def test_bad_json_is_rejected(text: str, message: str) -> None:
    with pytest.raises(HandleError) as exc:
        Handle.from_json(text)
    assert str(exc.value) == message


def test_unparsable_json_is_rejected() -> None:
    with pytest.raises(HandleError, match=r"^handle JSON does not parse: "):
        Handle.from_json("{not json")
