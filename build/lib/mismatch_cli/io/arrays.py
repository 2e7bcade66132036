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
    """The array's values as numpy (nulls as pyarrow converts them: NaN for floats, None for objects).

    pyarrow's `to_numpy` imports pandas (about 0.3 s) on its first call, even for a float column; a
    non-null number or bool array is read straight from its data buffer instead (a read-only view for
    numbers), which is what pyarrow returns for them too.
    """
    if array.null_count == 0 and not isinstance(array, pa.ChunkedArray):
        name = str(array.type)
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
