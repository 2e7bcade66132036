"""safetensors dumps: padded `[B, T]` tensors, or packed `[N]` tensors with `num_tokens` / `cu_seqlens`."""

from __future__ import annotations

import json
import os
import struct
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any, BinaryIO

import numpy as np
from safetensors import SafetensorError, safe_open

from ..errors import InputError
from ._common import check_file, missing_group, reason
from .aliases import resolve_roles
from .options import ReadOptions
from .remote import is_remote, open_remote, store_error
from .validate import Column, Decoded, PerRow

_READ_HINT = "check that the file is a complete safetensors file (re-save it if it was truncated)"
_FLOAT_DTYPES = {"F16", "BF16", "F32", "F64"}
_MASK_DTYPES = _FLOAT_DTYPES | {"BOOL", "U8", "I8", "U16", "I16", "U32", "I32", "U64", "I64"}
_INT_DTYPES = {"U8", "I8", "U16", "I16", "U32", "I32", "U64", "I64"}
_MAX_HEADER_BYTES = 100 * 1024 * 1024
_NUMPY_DTYPES = {"F16": "<f2", "F32": "<f4", "F64": "<f8", "BOOL": "?", "U8": "u1", "I8": "i1", "U16": "<u2",
                 "I16": "<i2", "U32": "<u4", "I32": "<i4", "U64": "<u8", "I64": "<i8"}
# safetensors' own framework tag, not a user label.
_FORMAT_TAGS = {"pt", "np", "tf", "flax", "mlx", "paddle"}


@dataclass(frozen=True)
class _Tensor:
    name: str
    dtype: str
    shape: tuple[int, ...]
    begin: int  # absolute byte offset of the first element in the file


def _read_header(path: str) -> tuple[dict[str, _Tensor], dict[str, str]]:
    """Parse the JSON header ourselves: safe_open hides byte offsets, which bf16 reads need."""
    try:
        with _open_raw(path) as (f, size):
            prefix = f.read(8)
            if len(prefix) < 8:
                raise ValueError("file is shorter than the 8-byte header length")
            (length,) = struct.unpack("<Q", prefix)
            if length > min(size - 8, _MAX_HEADER_BYTES):
                raise ValueError(f"header length {length} does not fit in a {size}-byte file")
            header: dict[str, Any] = json.loads(f.read(length))
    except (OSError, ValueError) as exc:
        if is_remote(path) and (known := store_error(exc, path)) is not None:
            raise known from exc
        raise InputError(f"cannot read {path} as safetensors: {reason(exc)}", hint=_READ_HINT) from exc
    if not isinstance(header, dict):
        raise InputError(f"cannot read {path} as safetensors: header is not a JSON object", hint=_READ_HINT)
    metadata = header.pop("__metadata__", None) or {}
    if not isinstance(metadata, dict):
        raise InputError(f"cannot read {path} as safetensors: __metadata__ is not a JSON object", hint=_READ_HINT)
    data_start = 8 + length
    tensors: dict[str, _Tensor] = {}
    try:
        for name, info in header.items():
            tensors[name] = _Tensor(
                name,
                str(info["dtype"]),
                tuple(int(d) for d in info["shape"]),
                data_start + int(info["data_offsets"][0]),
            )
    except (KeyError, TypeError, ValueError, IndexError) as exc:
        raise InputError(
            f"cannot read {path} as safetensors: malformed header entry ({reason(exc)})", hint=_READ_HINT
        ) from exc
    return tensors, {str(k): str(v) for k, v in metadata.items()}


@contextmanager
def _open_raw(path: str) -> Iterator[tuple[Any, int]]:
    """The file (local, or ranged reads over an object-store URI) and its size in bytes."""
    if is_remote(path):
        with open_remote(path) as handle:
            yield handle, handle.size()
    else:
        size = os.path.getsize(path)
        with open(path, "rb") as handle:
            yield handle, size


class _Reader:
    """Reads contiguous element ranges of a tensor: safe_open slices, raw bytes for bf16."""

    def __init__(self, path: str, handle: Any, raw: BinaryIO) -> None:
        self.path = path
        self.handle = handle
        self.raw = raw

    def rows(self, tensor: _Tensor, lo: int, hi: int) -> np.ndarray:
        """Rows `lo:hi` of the leading axis, flattened."""
        width = int(np.prod(tensor.shape[1:], dtype=np.int64))
        if tensor.dtype == "BF16":
            return self._bf16(tensor, lo * width, (hi - lo) * width)
        return self._slice(tensor, lambda view: view[lo:hi])

    def tokens(self, tensor: _Tensor, lo: int, hi: int) -> np.ndarray:
        """Positions `lo:hi` of a packed `[N]` or `[1, N]` tensor."""
        if tensor.dtype == "BF16":
            return self._bf16(tensor, lo, hi - lo)
        if len(tensor.shape) == 2:
            return self._slice(tensor, lambda view: view[:, lo:hi])
        return self._slice(tensor, lambda view: view[lo:hi])

    def whole(self, tensor: _Tensor) -> np.ndarray:
        """A small tensor (lengths, steps) in full, flattened."""
        size = int(np.prod(tensor.shape, dtype=np.int64))
        if tensor.dtype == "BF16":
            return self._bf16(tensor, 0, size)
        return self._slice(tensor, lambda view: view[:]) if tensor.shape else self._tensor(tensor)

    def _tensor(self, tensor: _Tensor) -> np.ndarray:
        try:
            return np.asarray(self.handle.get_tensor(tensor.name)).reshape(-1)
        except (SafetensorError, OSError, ValueError, TypeError) as exc:
            raise InputError(
                f"cannot read tensor {tensor.name!r} of {self.path}: {reason(exc)}", hint=_READ_HINT
            ) from exc

    def _slice(self, tensor: _Tensor, take: Callable[[Any], Any]) -> np.ndarray:
        try:
            values = take(self.handle.get_slice(tensor.name))
        except (SafetensorError, OSError, ValueError, TypeError) as exc:
            raise InputError(
                f"cannot read tensor {tensor.name!r} of {self.path}: {reason(exc)}", hint=_READ_HINT
            ) from exc
        return np.ascontiguousarray(values).reshape(-1)

    def _bf16(self, tensor: _Tensor, start: int, count: int) -> np.ndarray:
        # numpy has no bfloat16; a bf16 value is the top half of a float32, so widen the raw bits.
        self.raw.seek(tensor.begin + 2 * start)
        bits = np.fromfile(self.raw, dtype="<u2", count=count)
        if len(bits) != count:
            raise InputError(
                f"cannot read {self.path} as safetensors: tensor {tensor.name!r} is truncated",
                hint=_READ_HINT,
            )
        return (bits.astype(np.uint32) << 16).view(np.float32)


class _RangeReader(_Reader):
    """The same element ranges as `_Reader`, each one ranged read (an object store has no mmap for safe_open)."""

    def __init__(self, path: str, raw: Any) -> None:
        super().__init__(path, None, raw)

    def rows(self, tensor: _Tensor, lo: int, hi: int) -> np.ndarray:
        """Rows `lo:hi` of the leading axis, flattened."""
        width = int(np.prod(tensor.shape[1:], dtype=np.int64))
        return self._range(tensor, lo * width, (hi - lo) * width)

    def tokens(self, tensor: _Tensor, lo: int, hi: int) -> np.ndarray:
        """Positions `lo:hi` of a packed `[N]` or `[1, N]` tensor (contiguous either way)."""
        return self._range(tensor, lo, hi - lo)

    def whole(self, tensor: _Tensor) -> np.ndarray:
        """A small tensor in full, flattened."""
        return self._range(tensor, 0, int(np.prod(tensor.shape, dtype=np.int64)))

    def _range(self, tensor: _Tensor, start: int, count: int) -> np.ndarray:
        if tensor.dtype == "BF16":
            return (self._bytes(tensor, start, count, 2, "<u2").astype(np.uint32) << 16).view(np.float32)
        dtype = np.dtype(_NUMPY_DTYPES[tensor.dtype])
        return self._bytes(tensor, start, count, dtype.itemsize, dtype).astype(dtype.newbyteorder("="))

    def _bytes(self, tensor: _Tensor, start: int, count: int, itemsize: int, dtype: Any) -> np.ndarray:
        try:
            data = self.raw.read_at(count * itemsize, tensor.begin + start * itemsize)
        except OSError as exc:
            raise store_error(exc, self.path) or InputError(
                f"cannot read tensor {tensor.name!r} of {self.path}: {reason(exc)}", hint=_READ_HINT) from exc
        if len(data) != count * itemsize:
            raise InputError(f"cannot read {self.path} as safetensors: tensor {tensor.name!r} is truncated",
                             hint=_READ_HINT)
        return np.frombuffer(data, dtype=dtype)


def _shape(tensor: _Tensor) -> str:
    return "[" + ", ".join(str(d) for d in tensor.shape) + "]"


def _packed_lengths(reader: _Reader, tensors: dict[str, _Tensor], total: int, path: str) -> np.ndarray | None:
    """Row boundaries `cu` (int64, length B+1) from `cu_seqlens` or `num_tokens` (both must agree), or None."""
    found: dict[str, np.ndarray] = {}
    for name in ("cu_seqlens", "num_tokens"):
        tensor = tensors.get(name)
        if tensor is None:
            continue
        if tensor.dtype not in _INT_DTYPES or sum(d != 1 for d in tensor.shape) > 1 or 0 in tensor.shape:
            raise InputError(
                f"expected a 1-D integer tensor {name!r} in {path} with one value per sequence, got {tensor.dtype} "
                f"{_shape(tensor)}",
                hint=f"store {name} as one integer per sequence"
                + (" plus a leading 0" if name == "cu_seqlens" else ""),
            )
        values = reader.whole(tensor).astype(np.int64)
        if name == "num_tokens":
            if (values < 0).any() or int(values.sum()) != total:
                raise InputError(
                    f"expected tensor 'num_tokens' in {path} to hold non-negative lengths summing to {total} "
                    f"(the packed length), got sum {int(values.sum())}",
                    hint="num_tokens must list the length of every packed sequence, in order",
                )
            found[name] = np.concatenate([np.zeros(1, dtype=np.int64), np.cumsum(values)])
            continue
        problem = _cu_seqlens_problem(values, total)
        if problem is not None:
            raise InputError(
                f"expected tensor 'cu_seqlens' in {path} to start at 0, never decrease and end at {total} "
                f"(the packed length), but {problem}",
                hint="cu_seqlens must be the B+1 cumulative sequence boundaries of the packed tensors",
            )
        found[name] = values
    if len(found) == 2 and not np.array_equal(found["cu_seqlens"], found["num_tokens"]):
        cu, lengths = found["cu_seqlens"], found["num_tokens"]
        row = int(np.argmax(cu[: len(lengths)] != lengths[: len(cu)])) - 1 if len(cu) == len(lengths) else None
        where = f"from sequence {row}" if row is not None else f"on the number of sequences ({len(cu) - 1} vs " \
            f"{len(lengths) - 1})"
        raise InputError(f"tensors 'cu_seqlens' and 'num_tokens' in {path} disagree {where}",
                         hint="save both from the same sequence lengths, or keep one of them")
    return found.get("cu_seqlens", found.get("num_tokens"))


def _cu_seqlens_problem(cu: np.ndarray, total: int) -> str | None:
    if len(cu) == 0:
        return "it is empty"
    if cu[0] != 0:
        return f"it starts at {cu[0]}"
    decreasing = np.diff(cu) < 0
    if decreasing.any():
        index = int(np.argmax(decreasing)) + 1
        return f"it decreases at index {index} ({cu[index - 1]} -> {cu[index]})"
    if cu[-1] != total:
        return f"it ends at {cu[-1]}"
    return None


def decode_safetensors(path: str, options: ReadOptions) -> Iterator[Decoded]:
    """Stream a padded or packed safetensors dump as decoded chunks of at most `options.chunk_rows` rows."""
    if not is_remote(path):
        check_file(path)
    tensors, metadata = _read_header(path)
    roles = resolve_roles(list(tensors), options, path, noun="tensor")
    names = {role: name for role, name in roles.items() if name is not None}
    for role, name in names.items():
        allowed = _MASK_DTYPES if role == "response_mask" else _FLOAT_DTYPES
        if tensors[name].dtype not in allowed:
            raise InputError(
                f"expected a float tensor for {role}, got {tensors[name].dtype} in {path} tensor {name!r}",
                hint=f"store {role} as F32/F64/BF16/F16, or point --column {role}=NAME at the right tensor",
            )
    role_tensors = {role: tensors[name] for role, name in names.items()}
    reference = role_tensors["old_log_probs"]
    for role, tensor in role_tensors.items():
        if tensor.shape != reference.shape:
            raise InputError(
                f"expected tensor {tensor.name!r} ({role}) in {path} to have the shape of "
                f"{reference.name!r}, got {_shape(tensor)} and {_shape(reference)}",
                hint="every role must hold one value per token of the same responses",
            )

    if is_remote(path):
        with open_remote(path) as raw:
            yield from _stream(_RangeReader(path, raw), tensors, metadata, names, role_tensors, options, path)
        return
    try:
        handle_cm = safe_open(path, framework="numpy")
    except (SafetensorError, OSError, ValueError) as exc:
        raise InputError(f"cannot read {path} as safetensors: {reason(exc)}", hint=_READ_HINT) from exc
    with handle_cm as handle, open(path, "rb") as raw:
        yield from _stream(_Reader(path, handle, raw), tensors, metadata, names, role_tensors, options, path)


def _stream(reader: _Reader, tensors: dict[str, _Tensor], metadata: dict[str, str], names: dict[str, str],
            role_tensors: dict[str, _Tensor], options: ReadOptions, path: str) -> Iterator[Decoded]:
    """The decoded chunks of an opened dump, `options.chunk_rows` rows at a time."""
    reference = role_tensors["old_log_probs"]
    shape = reference.shape
    packed_1xn = len(shape) == 2 and shape[0] == 1 and ("cu_seqlens" in tensors or "num_tokens" in tensors)
    if len(shape) == 1 or packed_1xn:
        total = shape[-1]
        cu = _packed_lengths(reader, tensors, total, path)
        if cu is None:
            raise InputError(
                f"expected 'num_tokens' or 'cu_seqlens' next to the packed 1-D tensor "
                f"{reference.name!r} {_shape(reference)} in {path}, found neither",
                hint="save the per-sequence lengths as num_tokens [B] or cu_seqlens [B+1], "
                "or save padded [B, T] tensors",
            )
        packed = True
    elif len(shape) == 2:
        cu = np.arange(shape[0] + 1, dtype=np.int64) * shape[1]
        packed = False
    else:
        raise InputError(
            f"expected a [B, T] or packed [N] tensor for old_log_probs, got {_shape(reference)} "
            f"in {path} tensor {reference.name!r}",
            hint="save padded [B, T] tensors, or packed [N] tensors with num_tokens / cu_seqlens",
        )
    num_rows = len(cu) - 1
    steps_all = _steps(reader, tensors, metadata, options.step_column, num_rows, path)
    groups_all = {
        column: _group(reader, tensors, metadata, column, num_rows, path) for column in options.group_columns
    }
    labels = {
        k: v for k, v in metadata.items() if k != options.step_column and not (k == "format" and v in _FORMAT_TAGS)
    }

    for a in range(0, num_rows, options.chunk_rows):
        b = min(a + options.chunk_rows, num_rows)
        offsets = cu[a : b + 1] - cu[a]
        if packed:
            lo, hi = int(cu[a]), int(cu[b])
            values = {role: reader.tokens(t, lo, hi) for role, t in role_tensors.items()}
        else:
            values = {role: reader.rows(t, a, b) for role, t in role_tensors.items()}
        roles = {role: Column(v, offsets, names[role]) for role, v in values.items()}
        yield Decoded(
            source=path,
            first_row=a,
            old_log_probs=roles["old_log_probs"],
            rollout_log_probs=roles["rollout_log_probs"],
            response_mask=roles.get("response_mask"),
            noun="tensor",
            steps=None if steps_all is None else _rows(steps_all, a, b),
            labels=dict(labels),
            groups={column: _rows(found, a, b) for column, found in groups_all.items()},
        )


def _rows(values: PerRow, a: int, b: int) -> PerRow:
    """Rows `a:b` of a whole file's per-row values (one value for every row stays as it is)."""
    if isinstance(values.values, int):
        return values
    return PerRow(values.values[a:b], values.where, values.what)


def _per_row_integers(
    reader: _Reader, tensors: dict[str, _Tensor], key: str, num_rows: int, path: str, what: str
) -> np.ndarray | None:
    """A 1-D integer tensor named `key` with one value per row, or None when there is no such tensor."""
    tensor = tensors.get(key)
    if tensor is None:
        return None
    if tensor.dtype not in _INT_DTYPES or tensor.shape != (num_rows,):
        raise InputError(
            f"expected tensor {key!r} in {path} to be integer [{num_rows}] (one {what} per row), "
            f"got {tensor.dtype} {_shape(tensor)}",
            hint=f"store one integer {what} per sequence, or put a single {what} in __metadata__[{key!r}]",
        )
    return reader.whole(tensor)


def _steps(
    reader: _Reader, tensors: dict[str, _Tensor], metadata: dict[str, str], key: str, num_rows: int, path: str
) -> PerRow | None:
    """Per-row steps from a 1-D integer tensor named `key`, else from `__metadata__[key]`, else None."""
    values = _per_row_integers(reader, tensors, key, num_rows, path, "step")
    if values is not None:
        return PerRow(values, f"{path} tensor {key!r}", "step")
    if key in metadata:
        try:
            step = int(metadata[key].strip())
        except ValueError:
            raise InputError(
                f"expected an integer in __metadata__[{key!r}] of {path}, got {metadata[key]!r}",
                hint='write the training step as a decimal integer string, e.g. {"step": "12"}',
            ) from None
        return PerRow(step, f"__metadata__[{key!r}] of {path}", "step")
    return None


def _group(
    reader: _Reader, tensors: dict[str, _Tensor], metadata: dict[str, str], key: str, num_rows: int, path: str
) -> PerRow:
    """Per-row group labels from a 1-D integer tensor named `key`, else one label from `__metadata__[key]`."""
    values = _per_row_integers(reader, tensors, key, num_rows, path, "label")
    if values is not None:
        return PerRow(values, f"{path} tensor {key!r}")
    if key in metadata:
        labels = np.empty(num_rows, dtype=object)
        labels[:] = metadata[key]
        return PerRow(labels)
    raise missing_group(key, path, sorted([*tensors, *metadata]), noun="tensor or __metadata__ key")
