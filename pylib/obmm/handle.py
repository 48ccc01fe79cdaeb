"""Handle wire format: what an exporter sends an importer.

A handle carries everything an importing node needs to issue ``OBMM_CMD_IMPORT`` for memory that
another node exported. Unlike the seed's raw native-endian struct (which had no magic, version or
length and broke when the struct grew), this format is explicit little-endian, self-describing
and checksummed, so a mismatch is reported instead of importing garbage.

Version 1 layout: fixed size, all integers little-endian, every field naturally aligned so a C
implementation can use a packed struct plus ``le*toh`` conversions.

======  ====  ==============  =========================================================
offset  size  field           meaning
======  ====  ==============  =========================================================
0       4     magic           ``b"OBMH"``
4       2     version         u16, format version, 1
6       2     total_len       u16, total encoded size in bytes, 88 (``HANDLE_SIZE``)
8       8     mem_id          u64, exporter's mem_id
16      8     length          u64, region length in bytes
24      8     uba             u64, UB address of the region
32      4     tokenid         u32, access credential
36      4     scna            u32, source (exporter) CNA
40      4     dcna            u32, destination CNA
44      4     pxm_numa        s32, NUMA hint (-1: none)
48      16    seid            source EID, 16 raw bytes
64      16    deid            destination EID, 16 raw bytes
80      2     node_id         u16, exporter's node id
82      1     base_dist       u8, NUMA distance hint
83      1     reserved        must be 0
84      4     crc32           u32, ``zlib.crc32`` of bytes 0..83
======  ====  ==============  =========================================================

Decoding checks, in order: enough bytes for the 8-byte header, magic, version (a newer version
is reported as such before anything else, since its layout may differ), buffer size against
``total_len`` (truncated / trailing bytes), ``total_len`` against ``HANDLE_SIZE``, CRC, reserved
byte. Any failure raises :class:`HandleError`.
"""

from __future__ import annotations

import dataclasses
import json
import struct
import zlib
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, ClassVar, Protocol

from obmm.identity import EID_SIZE

if TYPE_CHECKING:
    from obmm.identity import NodeIdentity

__all__ = [
    "EID_SIZE",
    "HANDLE_MAGIC",
    "HANDLE_SIZE",
    "HANDLE_VERSION",
    "Handle",
    "HandleError",
]

HANDLE_MAGIC = b"OBMH"
HANDLE_VERSION = 1

_HEADER = struct.Struct("<4sHH")
# Fields after the header, up to (not including) the CRC. The last "B" is the reserved byte,
# unpacked (not skipped with "x") so decode can reject a non-zero value.
_BODY = struct.Struct("<QQQIIIi16s16sHBB")
_CRC = struct.Struct("<I")
HANDLE_SIZE = _HEADER.size + _BODY.size + _CRC.size
_CRC_OFFSET = HANDLE_SIZE - _CRC.size

assert HANDLE_SIZE == 88, HANDLE_SIZE  # the documented layout; a C twin relies on it

_U8_MAX = 0xFF
_U16_MAX = 0xFFFF
_U32_MAX = 0xFFFF_FFFF
_U64_MAX = 0xFFFF_FFFF_FFFF_FFFF
_S32_MIN = -(2**31)
_S32_MAX = 2**31 - 1

# JSON document tag, so a file of some other JSON is not mistaken for a handle.
_JSON_FORMAT = "obmm-handle"


class HandleError(ValueError):
    """An encoded handle (bytes or JSON) is malformed, corrupt or from a newer format."""


def _check_int(name: str, value: object, lo: int, hi: int) -> None:
    # bool is an int subclass; True as a mem_id is certainly a bug.
    if not isinstance(value, int) or isinstance(value, bool):
        raise TypeError(f"Handle.{name} must be an int, got {type(value).__name__}")
    if not lo <= value <= hi:
        raise ValueError(f"Handle.{name} = {value} is out of range [{lo}, {hi}]")


def _check_eid(name: str, value: object) -> None:
    if not isinstance(value, bytes):
        raise TypeError(f"Handle.{name} must be bytes, got {type(value).__name__}")
    if len(value) != EID_SIZE:
        raise ValueError(f"Handle.{name} must be exactly {EID_SIZE} bytes, got {len(value)}")


class ExportLike(Protocol):
    """What :meth:`Handle.from_export` reads of an export (`obmm.Export` has it)."""

    @property
    def mem_id(self) -> int: ...
    @property
    def tokenid(self) -> int: ...
    @property
    def uba(self) -> int: ...
    @property
    def length(self) -> int: ...


@dataclass(frozen=True)
class Handle:
    """One exported region, as published by its exporter (see the module docstring)."""

    mem_id: int
    tokenid: int
    length: int
    uba: int
    seid: bytes
    deid: bytes
    scna: int
    dcna: int
    pxm_numa: int
    base_dist: int
    node_id: int

    _INT_RANGES: ClassVar[tuple[tuple[str, int, int], ...]] = (
        ("mem_id", 0, _U64_MAX),
        ("tokenid", 0, _U32_MAX),
        ("length", 0, _U64_MAX),
        ("uba", 0, _U64_MAX),
        ("scna", 0, _U32_MAX),
        ("dcna", 0, _U32_MAX),
        ("pxm_numa", _S32_MIN, _S32_MAX),
        ("base_dist", 0, _U8_MAX),
        ("node_id", 0, _U16_MAX),
    )

    @classmethod
    def from_export(
        cls, export: ExportLike, identity: NodeIdentity, *, pxm_numa: int = -1, base_dist: int = 0
    ) -> Handle:
        """The handle an exporter publishes for `export`: the source fields are this node's
        `identity`, the destination fields zero (any importer may use it)."""
        return cls(
            mem_id=export.mem_id,
            tokenid=export.tokenid,
            length=export.length,
            uba=export.uba,
            seid=identity.eid,
            deid=bytes(EID_SIZE),
            scna=identity.cna,
            dcna=0,
            pxm_numa=pxm_numa,
            base_dist=base_dist,
            node_id=identity.node_id,
        )

    def __post_init__(self) -> None:
        for name, lo, hi in self._INT_RANGES:
            _check_int(name, getattr(self, name), lo, hi)
        _check_eid("seid", self.seid)
        _check_eid("deid", self.deid)

    # -- binary -----------------------------------------------------------------------------

    def encode(self) -> bytes:
        """Return the ``HANDLE_SIZE``-byte wire form."""
        head = _HEADER.pack(HANDLE_MAGIC, HANDLE_VERSION, HANDLE_SIZE)
        body = _BODY.pack(
            self.mem_id,
            self.length,
            self.uba,
            self.tokenid,
            self.scna,
            self.dcna,
            self.pxm_numa,
            self.seid,
            self.deid,
            self.node_id,
            self.base_dist,
            0,  # reserved
        )
        data = head + body
        return data + _CRC.pack(zlib.crc32(data))

    @classmethod
    def decode(cls, buf: bytes | bytearray | memoryview) -> Handle:
        """Parse exactly one encoded handle; raise :class:`HandleError` on any defect."""
        data = bytes(buf)
        if len(data) < _HEADER.size:
            raise HandleError(
                f"truncated handle: got {len(data)} bytes, need at least {_HEADER.size} "
                f"for the header"
            )
        magic, version, total_len = _HEADER.unpack_from(data)
        if magic != HANDLE_MAGIC:
            raise HandleError(
                f"not an obmm handle: bad magic {magic!r} (expected {HANDLE_MAGIC!r})"
            )
        if version > HANDLE_VERSION:
            raise HandleError(
                f"handle version {version} is newer than this obmm (supports "
                f"{HANDLE_VERSION}); upgrade obmm-testbed"
            )
        if version < 1:
            raise HandleError(
                f"handle version {version} is invalid (this obmm supports {HANDLE_VERSION})"
            )
        if len(data) < total_len:
            raise HandleError(
                f"truncated handle: got {len(data)} bytes, length field says {total_len}"
            )
        if len(data) > total_len:
            raise HandleError(
                f"{len(data) - total_len} trailing bytes after handle: got {len(data)} bytes, "
                f"length field says {total_len}"
            )
        if total_len != HANDLE_SIZE:
            raise HandleError(
                f"handle length field is {total_len}, version {version} handles are "
                f"{HANDLE_SIZE} bytes"
            )
        (stored_crc,) = _CRC.unpack_from(data, _CRC_OFFSET)
        actual_crc = zlib.crc32(data[:_CRC_OFFSET])
        if stored_crc != actual_crc:
            raise HandleError(
                f"handle CRC mismatch: stored {stored_crc:#010x}, computed {actual_crc:#010x} "
                f"(corrupted in transit?)"
            )
        (
            mem_id,
            length,
            uba,
            tokenid,
            scna,
            dcna,
            pxm_numa,
            seid,
            deid,
            node_id,
            base_dist,
            reserved,
        ) = _BODY.unpack_from(data, _HEADER.size)
        if reserved != 0:
            raise HandleError(f"handle reserved byte is {reserved:#04x}, must be 0")
        # Every field range equals its wire type's range, so construction cannot fail here.
        return cls(
            mem_id=mem_id,
            tokenid=tokenid,
            length=length,
            uba=uba,
            seid=seid,
            deid=deid,
            scna=scna,
            dcna=dcna,
            pxm_numa=pxm_numa,
            base_dist=base_dist,
            node_id=node_id,
        )

    # -- JSON (for humans and the CLI) ------------------------------------------------------

    def to_dict(self) -> dict[str, Any]:
        """Return a JSON-ready dict; EIDs become 32-digit lowercase hex strings."""
        out: dict[str, Any] = {"format": _JSON_FORMAT, "version": HANDLE_VERSION}
        for f in dataclasses.fields(self):
            value = getattr(self, f.name)
            out[f.name] = value.hex() if isinstance(value, bytes) else value
        return out

    def to_json(self, *, indent: int | None = None) -> str:
        """Return the handle as a JSON document (see :meth:`to_dict`)."""
        return json.dumps(self.to_dict(), indent=indent, sort_keys=indent is not None)

    @classmethod
    def from_dict(cls, doc: object) -> Handle:
        """Inverse of :meth:`to_dict`; raise :class:`HandleError` on any defect."""
        if not isinstance(doc, dict):
            raise HandleError(f"handle JSON must be an object, got {type(doc).__name__}")
        if doc.get("format") != _JSON_FORMAT:
            raise HandleError(
                f"not an obmm handle document: format is {doc.get('format')!r}, "
                f"expected {_JSON_FORMAT!r}"
            )
        version = doc.get("version")
        if not isinstance(version, int) or isinstance(version, bool) or version < 1:
            raise HandleError(f"handle JSON has invalid version {version!r}")
        if version > HANDLE_VERSION:
            raise HandleError(
                f"handle version {version} is newer than this obmm (supports "
                f"{HANDLE_VERSION}); upgrade obmm-testbed"
            )
        names = [f.name for f in dataclasses.fields(cls)]
        missing = [n for n in names if n not in doc]
        if missing:
            raise HandleError(f"handle JSON is missing field(s): {', '.join(missing)}")
        unknown = sorted(set(doc) - set(names) - {"format", "version"})
        if unknown:
            raise HandleError(f"handle JSON has unknown field(s): {', '.join(unknown)}")
        kwargs: dict[str, Any] = {}
        for name in names:
            value = doc[name]
            if name in ("seid", "deid"):
                if not isinstance(value, str):
                    raise HandleError(f"handle JSON field {name} must be a hex string")
                try:
                    value = bytes.fromhex(value)
                except ValueError:
                    raise HandleError(
                        f"handle JSON field {name} is not valid hex: {value!r}"
                    ) from None
            kwargs[name] = value
        try:
            return cls(**kwargs)
        except (TypeError, ValueError) as exc:
            raise HandleError(f"handle JSON: {exc}") from exc

    @classmethod
    def from_json(cls, text: str | bytes) -> Handle:
        """Parse a document produced by :meth:`to_json`; raise :class:`HandleError`."""
        try:
            doc = json.loads(text)
        except ValueError as exc:  # json.JSONDecodeError and UnicodeDecodeError
            raise HandleError(f"handle JSON does not parse: {exc}") from exc
        return cls.from_dict(doc)
