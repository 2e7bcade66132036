"""Arrow arrays to numpy without pyarrow's pandas-backed conversion where a zero-copy view does."""

from __future__ import annotations

import numpy as np
import pyarrow as pa

from ..system.guard import import_pandas_now

# Arrow's fixed-width number types by their type name, and numpy's same-layout dtype.
_FIXED_WIDTH = {
    "halffloat": np.float16, "float": np.float32, "double": np.float64,
    "int8": np.int8, "int16": np.int16, "int32": np.int32, "int64": np.int64,
    "uint8": np.uint8, "uint16": np.uint16, "uint32": np.uint32, "uint64": np.uint64,
}


def to_numpy(array: pa.Array) -> np.ndarray:
    """The array's values as numpy (nulls as pyarrow converts them: NaN for numbers, None for objects).

    pyarrow's `to_numpy` imports pandas (about 0.3 s, more beside torch's import) on its first call, even for a
    float column; a number or bool array is read straight from its buffers instead (a read-only view for
    non-null numbers; numbers with nulls as float64 with NaN there), and strings through Python objects: what
    pyarrow returns for them too.
    """
    if isinstance(array, pa.ChunkedArray):
        array = array.combine_chunks()
    name = str(array.type)
    if array.null_count and name in _FIXED_WIDTH and len(array):
        dtype = np.dtype(_FIXED_WIDTH[name])
        values = np.frombuffer(array.buffers()[1], dtype=dtype, count=len(array), offset=array.offset * dtype.itemsize)
        bits = np.frombuffer(array.buffers()[0], dtype=np.uint8)
        valid = np.unpackbits(bits, count=array.offset + len(array), bitorder="little")[array.offset:].view(bool)
        out = values.astype(np.float64 if dtype.kind in "iu" else dtype)
        out[~valid] = np.nan
        return out
    if pa.types.is_string(array.type) or pa.types.is_large_string(array.type) or pa.types.is_dictionary(array.type):
        out = np.empty(len(array), dtype=object)
        out[:] = array.to_pylist()
        return out
    if array.null_count == 0:
        if name in _FIXED_WIDTH:
            dtype = np.dtype(_FIXED_WIDTH[name])
            if len(array) == 0:
                return np.empty(0, dtype=dtype)
            return np.frombuffer(array.buffers()[1], dtype=dtype, count=len(array),
                                 offset=array.offset * dtype.itemsize)
        if name == "bool":
            if len(array) == 0:
                return np.empty(0, dtype=bool)
            bits = np.frombuffer(array.buffers()[1], dtype=np.uint8)
            return np.unpackbits(bits, count=array.offset + len(array), bitorder="little")[array.offset:].view(bool)
    import_pandas_now()  # pyarrow would import it from C++, where a Ctrl-C during the import is lost
    return array.to_numpy(zero_copy_only=False)


__all__ = ["to_numpy"]
