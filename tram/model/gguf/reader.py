"""A lean reader of GGUF files: metadata values and tensor records, tensor data as views of one
memory map.

gguf.GGUFReader makes numpy objects for every part of every metadata value; a 150k-token vocabulary
with its merges then costs ~420 MB of Python objects in each process that opens the file (the API
server for the config and tokenizer, the engine core for the weights): more than a Q4 0.5B model's
weights. Here string arrays are skipped unless asked for, and nothing else is kept. The layout is
the GGUF v2/v3 specification's (ggml/docs/gguf.md); type sizes come from the gguf package.
"""

from __future__ import annotations

import mmap
import struct
from dataclasses import dataclass
from typing import Any

import numpy as np

MAGIC = b"GGUF"
_SCALARS = {0: "<B", 1: "<b", 2: "<H", 3: "<h", 4: "<I", 5: "<i", 6: "<f", 7: "<?", 10: "<Q", 11: "<q", 12: "<d"}
_STRING, _ARRAY = 8, 9
_FLOAT_DTYPES = {0: np.float32, 1: np.float16}  # F32, F16; every other type is read as raw bytes


@dataclass
class GGUFTensor:
    name: str
    shape: tuple[int, ...]  # ggml order: shape[0] (ne0) is the row length
    tensor_type: int  # a gguf.GGMLQuantizationType value
    data_offset: int  # from the start of the file
    n_bytes: int
    _map: Any

    @property
    def type_name(self) -> str:
        from gguf import GGMLQuantizationType

        return GGMLQuantizationType(self.tensor_type).name

    @property
    def data(self) -> np.ndarray:
        """[rows, ...] in numpy order (reversed ggml shape); quantized types as bytes per row."""
        raw = np.frombuffer(self._map, dtype=np.uint8, count=self.n_bytes, offset=self.data_offset)
        rows = tuple(reversed(self.shape))
        if self.tensor_type in _FLOAT_DTYPES:
            return raw.view(_FLOAT_DTYPES[self.tensor_type]).reshape(rows)
        return raw.reshape(*rows[:-1], -1)


class GGUFFile:
    """Parsed header of a GGUF file. `fields` maps each metadata key to its value; string arrays
    other than `keep_strings` hold only their length. ValueError for anything malformed."""

    def __init__(self, path: str, keep_strings: tuple[str, ...] = ()) -> None:
        with open(path, "rb") as f:
            self._map = mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ)
        self.path = path
        self._keep = keep_strings
        if self._map[:4] != MAGIC:
            raise ValueError(f"bad magic {bytes(self._map[:4])!r} (a GGUF file starts with {MAGIC!r})")
        self._pos = len(MAGIC)
        version, n_tensors, n_kv = self._unpack("<IQQ")
        if version not in (2, 3):
            raise ValueError(f"GGUF version {version} is not supported (2 and 3 are)")
        self.fields: dict[str, Any] = {}
        for _ in range(n_kv):
            key = self._string()
            self.fields[key] = self._value(self._unpack("<I")[0], key in keep_strings)
        infos = [self._tensor_info() for _ in range(n_tensors)]
        align = int(self.fields.get("general.alignment", 32))
        start = -(-self._pos // align) * align
        self.tensors = [
            GGUFTensor(name, shape, qtype, start + offset, _n_bytes(name, shape, qtype), self._map)
            for name, shape, qtype, offset in infos
        ]

    def _unpack(self, fmt: str) -> tuple:
        values = struct.unpack_from(fmt, self._map, self._pos)
        self._pos += struct.calcsize(fmt)
        return values

    def _string(self) -> str:
        (length,) = self._unpack("<Q")
        end = self._pos + length
        if end > len(self._map):
            raise ValueError("a string runs past the end of the file")
        text = self._map[self._pos : end].decode("utf-8", errors="replace")
        self._pos = end
        return text

    def _value(self, kind: int, keep: bool) -> Any:
        if kind in _SCALARS:
            return self._unpack(_SCALARS[kind])[0]
        if kind == _STRING:
            return self._string()
        if kind != _ARRAY:
            raise ValueError(f"unknown metadata value type {kind}")
        item, count = self._unpack("<IQ")
        if item in _SCALARS:
            fmt = _SCALARS[item]
            size = struct.calcsize(fmt)
            values = np.frombuffer(self._map, dtype=np.dtype(fmt), count=count, offset=self._pos).tolist()
            self._pos += size * count
            return values
        if item != _STRING:
            raise ValueError(f"arrays of value type {item} are not supported")
        if keep:
            return [self._string() for _ in range(count)]
        for _ in range(count):  # skipped: a length, then that many bytes
            self._pos += 8 + struct.unpack_from("<Q", self._map, self._pos)[0]
        return count

    def _tensor_info(self) -> tuple[str, tuple[int, ...], int, int]:
        name = self._string()
        (n_dims,) = self._unpack("<I")
        shape = self._unpack(f"<{n_dims}Q")
        qtype, offset = self._unpack("<IQ")
        return name, tuple(int(d) for d in shape), int(qtype), int(offset)


def _n_bytes(name: str, shape: tuple[int, ...], qtype: int) -> int:
    from gguf import GGML_QUANT_SIZES, GGMLQuantizationType

    try:
        block, size = GGML_QUANT_SIZES[GGMLQuantizationType(qtype)]
    except (ValueError, KeyError):
        raise ValueError(f"tensor {name} has an unknown tensor type {qtype}") from None
    count = int(np.prod(shape, dtype=np.int64))
    if shape[0] % block:
        raise ValueError(f"tensor {name}: rows of {shape[0]} are not whole blocks of {block}")
    return count // block * size
