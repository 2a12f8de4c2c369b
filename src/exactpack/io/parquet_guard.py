"""A Parquet file's decoded size, bounded before a page is decompressed.

:func:`check_row_groups` bounds each row group's decoded size from the footer **and** every
page header (a hostile footer may understate it); a row group over
:attr:`ReadLimits.decoded_bytes`, or over :attr:`ReadLimits.ratio` times its compressed size
beyond :attr:`ReadLimits.floor`, is refused naming the file, the row group and the sizes.
"""

from __future__ import annotations

from collections.abc import Collection, Iterator
from typing import Any, BinaryIO

from exactpack.core.errors import InvalidInput, foreign
from exactpack.io.files import ReadLimits

#: Decoded bytes per value by Parquet physical type (plus one for levels and validity).
_WIDTH = {"BOOLEAN": 1, "INT32": 4, "FLOAT": 4, "INT64": 8, "DOUBLE": 8, "INT96": 12}
#: Bytes of a page header read at a time (its statistics may hold long min/max values).
_HEADER_READ = 1 << 16
_MAX_HEADER = 1 << 24


class _Compact:
    """A reader of Thrift's compact protocol over ``data`` (enough to skip any struct)."""

    def __init__(self, data: bytes) -> None:
        self.data, self.pos = data, 0

    def byte(self) -> int:
        if self.pos >= len(self.data):
            raise EOFError
        self.pos += 1
        return self.data[self.pos - 1]

    def varint(self) -> int:
        out = 0
        for shift in range(0, 77, 7):
            b = self.byte()
            out |= (b & 0x7F) << shift
            if not b & 0x80:
                return out
        raise ValueError("varint too long")

    def zigzag(self) -> int:
        n = self.varint()
        return (n >> 1) ^ -(n & 1)

    def skip(self, kind: int, depth: int = 0) -> None:
        if depth > 32:
            raise ValueError("nested too deep")
        if kind in (3, 7):
            self.pos += 1 if kind == 3 else 8
        elif kind in (4, 5, 6):
            self.varint()
        elif kind == 8:
            size = self.varint()  # read before moving: the length precedes the bytes
            self.pos += size
        elif kind in (9, 10):
            head = self.byte()
            size = head >> 4 if head >> 4 != 15 else self.varint()
            for _ in range(size):
                self.element(head & 0x0F, depth)
        elif kind == 11:
            types = self.byte() if (size := self.varint()) else 0
            for _ in range(size):
                self.element(types >> 4, depth)
                self.element(types & 0x0F, depth)
        elif kind == 12:
            self.struct(lambda *_: False, depth + 1)
        elif kind not in (1, 2):  # booleans inside a field header carry no byte
            raise ValueError(f"unknown Thrift type {kind}")
        if self.pos > len(self.data):
            raise EOFError

    def element(self, kind: int, depth: int) -> None:
        """Skip one list, set or map element: a boolean there is one byte (in a field
        header it is the type itself), so a huge boolean map cannot spin without reading."""
        if kind in (1, 2):
            self.byte()
        else:
            self.skip(kind, depth + 1)

    def struct(self, take: Any, depth: int = 0) -> None:
        """Walk one struct; ``take(field_id, kind)`` reads a field itself (True) or skips it."""
        last = 0
        while head := self.byte():  # 0: the struct's end
            kind, delta = head & 0x0F, head >> 4
            last = field = last + delta if delta else self.zigzag()
            if not take(field, kind):
                self.skip(kind, depth)


def _page_header(data: bytes) -> tuple[int, int, int, int]:
    """``(header bytes, uncompressed size, compressed size, values)`` of the page header at
    the start of ``data`` (EOFError when ``data`` ends inside it)."""
    reader = _Compact(data)
    found = {1: 0, 2: 0, 3: 0}  # 2: uncompressed size, 3: compressed size, 1: values

    def take(field: int, kind: int, page: bool = False) -> bool:
        if kind == 5 and field in ((1,) if page else (2, 3)):
            found[field] = reader.zigzag()
        elif kind == 12 and not page and field in (5, 7, 8):  # a page's num_values is field 1
            reader.struct(lambda sub, sub_kind: take(sub, sub_kind, True), 1)
        else:
            return False
        return True

    reader.struct(take)
    return reader.pos, found[2], found[3], found[1]


def _page_headers(f: BinaryIO, start: int, end: int) -> Iterator[tuple[int, int]]:
    """``(uncompressed size, values)`` of each page of a column chunk in ``[start, end)``."""
    pos = start
    while pos < end:
        want = _HEADER_READ
        while True:
            f.seek(pos)
            data = f.read(min(want, max(end - pos, 1)))
            try:
                size, uncompressed, compressed, values = _page_header(data)
                break
            except EOFError:
                if len(data) < want or want >= _MAX_HEADER:
                    raise ValueError("a page header runs past its column chunk") from None
                want *= 4
        if uncompressed < 0 or compressed < 0 or values < 0:
            raise ValueError("a page header holds a negative size")
        yield uncompressed, values
        pos += size + compressed


def _chunk_bytes(f: BinaryIO, column: Any) -> tuple[int, int]:
    """``(decoded bytes bound, compressed bytes)`` of one column chunk."""
    width = _WIDTH.get(column.physical_type, 0)
    # the chunk starts at its dictionary page when it has one (writers leave the data page
    # offset 0 in an empty row group); an offset of 0 would be the file's magic bytes
    dictionary = column.dictionary_page_offset if column.has_dictionary_page else None
    start = min([o for o in (column.data_page_offset, dictionary) if o and o > 0] or [0])
    if start <= 0:
        if column.total_compressed_size > 0:
            raise ValueError("a column chunk without a page offset")
        return 0, 0
    pages = list(_page_headers(f, start, start + column.total_compressed_size))
    inflated = max(column.total_uncompressed_size, sum(u for u, _ in pages))
    values = max(column.num_values, sum(v for _, v in pages))
    if column.physical_type == "FIXED_LEN_BYTE_ARRAY":
        width = max(1, inflated // max(1, values))
    elif width == 0 and column.has_dictionary_page and pages:  # strings repeated by index
        width = 4 + max(1, pages[0][0] // max(1, pages[0][1]))
    return max(inflated, values * (width + 1)), column.total_compressed_size


def check_row_groups(
    f: BinaryIO, path: object, meta: Any, columns: Collection[str], limits: ReadLimits
) -> None:
    """Refuse ``path`` when a row group's ``columns`` would decode to more than ``limits``
    allow (see the module docstring); reads only page headers."""
    wanted = set(columns)
    for g in range(meta.num_row_groups):
        group = meta.row_group(g)
        decoded = compressed = 0
        what = f"{path}: row group {g} cannot be read as Parquet"
        with foreign(what, "the file is damaged; write it again"):
            for c in range(group.num_columns):
                if (column := group.column(c)).path_in_schema.split(".")[0] in wanted:
                    d, z = _chunk_bytes(f, column)
                    decoded, compressed = decoded + d, compressed + z
        if decoded > limits.floor and decoded > limits.ratio * max(1, compressed):
            raise InvalidInput(
                f"{path}: row group {g} would decode to {decoded:,} bytes,"
                f" {decoded / max(1, compressed):,.0f}x its {compressed:,} compressed bytes (a"
                f" decompression bomb?) — refused before decoding; if the data is genuine, write"
                f" it with row groups of at most {limits.floor >> 20} MiB decoded"
            )
        if decoded > limits.decoded_bytes:
            raise InvalidInput(
                f"{path}: row group {g} would decode to {decoded:,} bytes, more than the"
                f" {limits.decoded_bytes:,} bytes a read may use — refused before decoding;"
                " write the file with smaller row groups, or raise --max-metadata-bytes"
            )
    f.seek(0)
