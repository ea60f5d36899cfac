"""A GGUF header parser that stops before the weights.

gguf.GGUFReader (llama.cpp's gguf-py) builds numpy views of every metadata array and tensor,
which takes seconds on a model with a 49k-token vocabulary. Validating needs only lengths and
offsets, so this parser reads the same layout with struct and skips array contents; the type
tables (value types, quantization block sizes) still come from gguf.constants.
"""

from __future__ import annotations

import mmap
import struct
from dataclasses import dataclass, field
from typing import Any

from gguf.constants import GGML_QUANT_SIZES, GGMLQuantizationType, GGUFValueType

GGUF_MAGIC = b"GGUF"
SUPPORTED_VERSIONS = (2, 3)  # what llama.cpp reads; version 1 was dropped long ago
HEADER_BYTES = 24  # magic, version, tensor count, metadata count
GGML_MAX_DIMS = 4
DEFAULT_ALIGNMENT = 32
SMALL_ARRAY = 4096  # numeric arrays up to this length are kept (per-layer hyperparameters)
TOKENS_KEY = "tokenizer.ggml.tokens"

Buffer = bytes | mmap.mmap  # what the parser reads from: a mapped file, or bytes in tests

_SCALARS: dict[int, struct.Struct] = {
    GGUFValueType.UINT8: struct.Struct("<B"),
    GGUFValueType.INT8: struct.Struct("<b"),
    GGUFValueType.UINT16: struct.Struct("<H"),
    GGUFValueType.INT16: struct.Struct("<h"),
    GGUFValueType.UINT32: struct.Struct("<I"),
    GGUFValueType.INT32: struct.Struct("<i"),
    GGUFValueType.FLOAT32: struct.Struct("<f"),
    GGUFValueType.BOOL: struct.Struct("<?"),
    GGUFValueType.UINT64: struct.Struct("<Q"),
    GGUFValueType.INT64: struct.Struct("<q"),
    GGUFValueType.FLOAT64: struct.Struct("<d"),
}
_U32 = struct.Struct("<I")
_U64 = struct.Struct("<Q")


class Truncated(Exception):
    """A read ran past the end of the file."""


class Corrupt(Exception):
    """A value that no valid GGUF holds."""


class UnsupportedVersion(Corrupt):
    """A GGUF version this reader (and llama.cpp) does not read: ``version`` as stored, ``big_endian`` if
    it is a supported version written byte-swapped (a file made for a big-endian machine)."""

    def __init__(self, text: str, version: int, big_endian: bool = False) -> None:
        super().__init__(text)
        self.version = version
        self.big_endian = big_endian


@dataclass
class TensorInfo:
    name: str
    dims: tuple[int, ...]
    ggml_type: int
    offset: int
    n_bytes: int


@dataclass
class Header:
    version: int
    metadata: dict[str, object] = field(default_factory=dict)
    arrays: dict[str, tuple[int, int]] = field(default_factory=dict)  # key -> (item type, length), every array
    tokens: list[bytes] | None = None  # the vocabulary's strings, when it is a list of strings
    tensors: list[TensorInfo] = field(default_factory=list)
    data_start: int = 0


def _read_strings(buf: Buffer, pos: int, count: int, size: int, keep: bool) -> tuple[list[bytes], int]:
    """``count`` length-prefixed strings from ``pos``: (the strings if ``keep``, else [], the end).

    One tight loop, not _Cursor calls: a vocabulary holds up to a few hundred thousand strings.
    """
    out: list[bytes] = []
    append = out.append
    unpack = _U64.unpack_from
    for _ in range(count):
        if pos + 8 > size:
            raise Truncated
        (n,) = unpack(buf, pos)
        pos += 8
        end = pos + n
        if end > size:
            raise Truncated
        if keep:
            append(buf[pos:end])
        pos = end
    return out, pos


class _Cursor:
    """Bounds-checked little-endian reads from a buffer."""

    def __init__(self, buf: Buffer, size: int) -> None:
        self.buf = buf
        self.size = size
        self.pos = 0

    def take(self, n: int) -> int:
        start = self.pos
        if n < 0 or start + n > self.size:
            raise Truncated
        self.pos = start + n
        return start

    def unpack(self, s: struct.Struct) -> Any:
        return s.unpack_from(self.buf, self.take(s.size))[0]

    def string(self) -> str:
        n = self.unpack(_U64)
        start = self.take(n)
        try:
            return bytes(self.buf[start : start + n]).decode("utf-8")
        except UnicodeDecodeError as exc:
            raise Corrupt(f"a string at byte {start} is not UTF-8") from exc

    def value(self, vtype: int, depth: int = 0) -> object:
        if vtype in _SCALARS:
            return self.unpack(_SCALARS[vtype])
        if vtype == GGUFValueType.STRING:
            return self.string()
        if vtype == GGUFValueType.ARRAY:
            return self.array(depth)[2]
        raise Corrupt(f"unknown metadata value type {vtype}")

    def array(self, depth: int = 0, keep_strings: bool = False) -> tuple[int, int, object]:
        """An array's (item type, length, value): numbers kept up to SMALL_ARRAY, strings only if asked."""
        if depth > 2:
            raise Corrupt("arrays nested too deeply")
        item_type = self.unpack(_U32)
        count = self.unpack(_U64)
        if item_type in _SCALARS:
            item = _SCALARS[item_type]
            if count * item.size > self.size - self.pos:
                raise Truncated
            if count <= SMALL_ARRAY:
                start = self.pos
                self.take(count * item.size)
                return item_type, count, [item.unpack_from(self.buf, start + k * item.size)[0] for k in range(count)]
            self.take(count * item.size)
            return item_type, count, None
        if item_type == GGUFValueType.STRING:
            if count * 8 > self.size - self.pos:  # each string needs at least its length
                raise Truncated
            # Skipped, not decoded (vocabularies are large); kept as bytes when asked for.
            strings, self.pos = _read_strings(self.buf, self.pos, count, self.size, keep_strings)
            return item_type, count, strings if keep_strings else None
        if item_type == GGUFValueType.ARRAY:
            for _ in range(count):
                self.value(item_type, depth + 1)
            return item_type, count, None
        raise Corrupt(f"unknown array item type {item_type}")


def parse_header(buf: Buffer, size: int) -> Header:
    """Header, metadata and tensor table of the GGUF file in ``buf``; raises Truncated or Corrupt."""
    cur = _Cursor(buf, size)
    cur.take(4)  # magic, checked by the caller
    header = Header(_read_version(cur))
    n_tensors = cur.unpack(_U64)
    n_kv = cur.unpack(_U64)
    rest = cur.size - cur.pos
    # Every metadata pair takes at least 13 bytes and every tensor entry 32: larger counts are
    # impossible for this file length (and would make the loops below spin on garbage).
    if n_kv * 13 > rest or n_tensors * 32 > rest:
        raise Truncated(
            f"its header claims {n_kv} metadata entries and {n_tensors} tensors, more than the file can hold"
        )
    for i in range(n_kv):
        try:
            _read_metadata_entry(cur, header)
        except Truncated as exc:
            raise Truncated(f"it ends inside its metadata, in entry {i + 1} of {n_kv}") from exc
    alignment = header.metadata.get("general.alignment", DEFAULT_ALIGNMENT)
    if not isinstance(alignment, int) or alignment <= 0 or alignment & (alignment - 1):
        raise Corrupt(f"general.alignment {alignment!r} is not a power of two")
    names: set[str] = set()
    for i in range(n_tensors):
        try:
            name, dims, ggml_type, offset = _read_tensor_entry(cur)
        except Truncated as exc:
            raise Truncated(f"it ends inside its tensor table, in tensor {i + 1} of {n_tensors}") from exc
        if name in names:
            raise Corrupt(f"tensor {name!r} appears twice")
        names.add(name)
        header.tensors.append(_tensor_info(name, dims, ggml_type, offset, alignment))
    header.data_start = -(-cur.pos // alignment) * alignment
    return header


def _read_version(cur: _Cursor) -> int:
    version: int = cur.unpack(_U32)
    if version not in SUPPORTED_VERSIONS:
        if version == 1:
            raise UnsupportedVersion("GGUF version 1 is not supported by llama.cpp (convert the model again)", 1)
        swapped = struct.unpack("<I", struct.pack(">I", version))[0]
        if swapped in (1, 2, 3):
            raise UnsupportedVersion("big-endian GGUF files are not supported", swapped, big_endian=True)
        raise UnsupportedVersion(f"unknown GGUF version {version}", version)
    return version


def _read_metadata_entry(cur: _Cursor, header: Header) -> None:
    """One key and its value into ``header`` (an array's item type and length too; the vocabulary apart)."""
    key = cur.string()
    vtype = cur.unpack(_U32)
    if vtype != GGUFValueType.ARRAY:
        header.metadata[key] = cur.value(vtype)
        return
    item_type, count, value = cur.array(keep_strings=key == TOKENS_KEY)
    header.arrays[key] = (item_type, count)
    if key == TOKENS_KEY and item_type == GGUFValueType.STRING:
        header.tokens = value  # type: ignore[assignment]
        value = None
    header.metadata[key] = value


def _read_tensor_entry(cur: _Cursor) -> tuple[str, tuple[int, ...], int, int]:
    """One tensor table entry: (name, dimensions, ggml type, offset)."""
    name = cur.string()
    n_dims = cur.unpack(_U32)
    if not 1 <= n_dims <= GGML_MAX_DIMS:
        raise Corrupt(f"tensor {name!r} has {n_dims} dimensions (1..{GGML_MAX_DIMS} allowed)")
    dims = tuple(cur.unpack(_U64) for _ in range(n_dims))
    ggml_type = cur.unpack(_U32)
    offset = cur.unpack(_U64)
    return name, dims, ggml_type, offset


def _tensor_info(name: str, dims: tuple[int, ...], ggml_type: int, offset: int, alignment: int) -> TensorInfo:
    """The entry checked against its type's block size and the file's alignment, with its size in bytes."""
    try:
        block, type_size = GGML_QUANT_SIZES[GGMLQuantizationType(ggml_type)]
    except (ValueError, KeyError) as exc:
        raise Corrupt(f"tensor {name!r} has unknown type {ggml_type}") from exc
    if dims[0] % block:
        raise Corrupt(f"tensor {name!r}: row of {dims[0]} is not a multiple of the block size {block}")
    if offset % alignment:
        raise Corrupt(f"tensor {name!r} has offset {offset}, not aligned to {alignment}")
    n_elements = 1
    for d in dims:
        n_elements *= d
    return TensorInfo(name, dims, ggml_type, offset, n_elements // block * type_size)


def first_int(value: object) -> int | None:
    """A metadata value as an int (None if it is not one; a bool counts as 0 or 1)."""
    if isinstance(value, bool):
        return int(value)
    if isinstance(value, int):
        return value
    return None
