"""`write_dump`: what a trainer calls to write one batch of `[B, T]` log-probs in mismatch's wide parquet layout.

Takes torch tensors or numpy arrays, a mapping of them, or a verl `DataProto`-like object (`.batch`
holding the tensors, `.meta_info["global_steps"]` the step) without importing torch or verl. Each
call writes one file, atomically (`output.streamed_file`): into a folder as `step_000123.parquet`, so
that calls over a run add up to a folder `mismatch analyze DIR --by step` reads, or to a `.parquet` path.
"""

from __future__ import annotations

import os
import re
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import numpy as np

from mismatch_cli.errors import DataError, InputError, UsageError
from mismatch_cli.io.aliases import ROLE_ALIASES

ROLES = ("old_log_probs", "rollout_log_probs", "response_mask")
STEP_KEYS = ("global_steps", "global_step", "step")  # verl's meta_info spelling first
FLOAT_DTYPES = ("float32", "float64")
ROW_GROUP = 1024
_NUMBERED = re.compile(r"^dump_(\d+)\.parquet$")


def _field(data: Any, name: str) -> Any:
    """`data[name]`, `data.name`, or None."""
    if isinstance(data, Mapping):
        return data.get(name)
    return getattr(data, name, None)


def _unpack(data: Any) -> tuple[Mapping[str, Any], Mapping[str, Any]]:
    """(tensors, meta_info) of a DataProto-like object, a {"batch": ..., "meta_info": ...} dict or a plain mapping."""
    batch = _field(data, "batch")
    if batch is not None:
        meta = _field(data, "meta_info") or {}
        if not hasattr(batch, "keys") or not hasattr(batch, "__getitem__"):
            raise InputError(f"write_dump: data.batch is a {type(batch).__name__}, not a mapping of tensors",
                             hint="pass verl's DataProto, a dict with 'batch' (a TensorDict or dict), or a dict "
                             "of [B, T] tensors")
        return batch, meta if isinstance(meta, Mapping) else {}
    if isinstance(data, Mapping) or (hasattr(data, "keys") and hasattr(data, "__getitem__")):  # a TensorDict
        return data, {}
    raise InputError(f"write_dump: cannot read tensors from a {type(data).__name__}",
                     hint="pass verl's DataProto, a dict with 'batch', or a dict of [B, T] tensors; or use the "
                     "old_log_probs=, rollout_log_probs=, response_mask= keywords")


def _pick(tensors: Mapping[str, Any], role: str) -> Any:
    keys = list(tensors.keys())
    for name in ROLE_ALIASES[role]:
        if name in keys:
            return tensors[name]
    shown = ", ".join(map(str, keys[:12])) or "none"
    raise InputError(f"write_dump: no {role} in the batch (its keys: {shown})",
                     hint=f"pass {role}=TENSOR, or put it in the batch under {role!r} (verl computes old_log_probs "
                     "in the trainer; rollout_log_probs needs actor_rollout_ref.rollout.calculate_log_probs=true)")


def _advantages(values: np.ndarray, rows: int, width: int, column: Any, float_type: Any, dtype: str) -> Any:
    """The advantages column: `[B, T]` as a list per row, `[B]` as one number per row."""
    import pyarrow as pa

    if values.dtype.kind not in "biuf":
        raise UsageError(f"write_dump: advantages hold {values.dtype} values, not numbers",
                         hint="pass advantages as a float tensor of shape [B, T] or [B]")
    if values.shape == (rows, width):
        return column(values, float_type, np.dtype(dtype).type)
    if values.shape == (rows,):
        return pa.array(values.astype(np.dtype(dtype)), type=float_type)
    raise UsageError(f"write_dump: advantages have shape {tuple(values.shape)}, expected ({rows}, {width}) or "
                     f"({rows},)", hint="pass one advantage per token or one per row")


def as_array(value: Any, role: str) -> np.ndarray:
    """A numpy view of a torch tensor (any device; bf16 / fp16 widened to float32), a numpy array or a list."""
    if hasattr(value, "detach") and hasattr(value, "cpu"):  # torch.Tensor, duck-typed: no torch import here
        value = value.detach()
        dtype = str(getattr(value, "dtype", ""))
        if dtype in ("torch.bfloat16", "torch.float16") or dtype.startswith("torch.float8"):
            value = value.float()  # numpy has none of these; float32 holds them all exactly
        try:
            value = value.cpu().numpy()
        except (TypeError, RuntimeError, NotImplementedError) as exc:  # a meta tensor, a dtype numpy lacks
            raise InputError(f"write_dump: {role} cannot be read as numbers ({dtype} on {value.device}: {exc})",
                             hint=f"pass {role} as a float tensor holding its values") from None
    try:
        array = np.asarray(value)
    except (TypeError, ValueError) as exc:
        raise InputError(f"write_dump: {role} is not an array ({type(value).__name__}: {exc})",
                         hint=f"pass {role} as a [B, T] torch tensor or numpy array") from None
    if array.ndim == 0 and array.dtype.kind not in "biuf":  # a string, a dict, None: not a tensor at all
        raise InputError(f"write_dump: {role} is a {type(value).__name__}, not an array",
                         hint=f"pass {role} as a [B, T] torch tensor or numpy array")
    return array


def _check(old: np.ndarray, rollout: np.ndarray, mask: np.ndarray) -> None:
    """Refuse shapes, dtypes and mask values the readers would refuse, naming the row and position."""
    for role, array in zip(ROLES, (old, rollout, mask), strict=True):
        if array.ndim != 2:
            raise InputError(f"write_dump: {role} must be [B, T] (one row per response), got shape "
                             f"{list(array.shape)}", hint="pass the padded [batch, response_length] tensor; "
                             "for one sequence use tensor[None, :]")
    if not old.shape == rollout.shape == mask.shape:
        raise InputError(f"write_dump: shapes differ: old_log_probs {list(old.shape)}, rollout_log_probs "
                         f"{list(rollout.shape)}, response_mask {list(mask.shape)}",
                         hint="pass the three tensors of one batch, all [B, T] over the same response positions")
    if old.shape[0] == 0 or old.shape[1] == 0:
        raise DataError(f"write_dump: the batch is empty (shape {list(old.shape)})",
                        hint="call write_dump with at least one response of at least one token")
    for role, array in (("old_log_probs", old), ("rollout_log_probs", rollout)):
        if array.dtype.kind != "f":
            raise InputError(f"write_dump: {role} must hold floating-point log-probs, got dtype {array.dtype}",
                             hint=f"pass the {role} tensor itself (float32, float64, bf16 or fp16)")
    if mask.dtype.kind not in "biuf":
        raise InputError(f"write_dump: response_mask must be bool, integer or float 0/1, got dtype {mask.dtype}",
                         hint="pass batch['response_mask'] (1 on trained-on tokens, 0 on padding)")
    bad = ~((mask == 0) | (mask == 1))
    if bad.any():
        row, position = (int(i) for i in np.argwhere(bad)[0])
        raise DataError(f"write_dump: response_mask row {row} position {position} is {mask[row, position].item()!r}, "
                        "not 0 or 1", hint="pass the 0/1 mask itself, not loss weights")


def _step(step: Any, meta: Mapping[str, Any]) -> int | None:
    if step is None:
        step = next((meta[k] for k in STEP_KEYS if meta.get(k) is not None), None)
    if step is None:
        return None
    if hasattr(step, "item") and np.size(step.cpu() if hasattr(step, "cpu") else step) == 1:
        step = step.item()  # a 0-d or one-element tensor / array
    if isinstance(step, bool) or not isinstance(step, (int, np.integer)) or not 0 <= step < 2 ** 63:
        raise UsageError(f"write_dump: step must be an integer >= 0 (below 2^63), got {step!r}",
                         hint="pass step=self.global_steps (or leave it out)")
    return int(step)


def _labels(values: Any, name: str, rows: int) -> Any:
    import pyarrow as pa

    array = as_array(values, name)
    if array.ndim != 1 or len(array) != rows:
        raise InputError(f"write_dump: {name} must hold one value per row ({rows}), got shape {list(array.shape)}",
                         hint=f"pass {name} as a 1-D array of length B")
    if array.dtype.kind in "iu":
        return pa.array(array.astype(np.int64))
    return pa.array([None if v is None else str(v) for v in array.tolist()], type=pa.string())


def _target(path: str | os.PathLike, step: int | None) -> Path:
    """The file to write: `path` itself for a .parquet name, else a numbered file inside the folder `path`."""
    target = Path(path)
    if target.suffix == ".parquet" and not target.is_dir():
        return target
    if target.exists() and not target.is_dir():
        raise UsageError(f"write_dump: {target} exists and is neither a folder nor a .parquet file",
                         hint="pass a folder (one file per call) or a path ending in .parquet")
    if step is not None:
        return target / f"step_{step:06d}.parquet"
    taken = [int(m.group(1)) for m in map(_NUMBERED.match, os.listdir(target) if target.is_dir() else []) if m]
    return target / f"dump_{max(taken, default=-1) + 1:06d}.parquet"


def write_dump(
    path: str | os.PathLike,
    data: Any = None,
    *,
    old_log_probs: Any = None,
    rollout_log_probs: Any = None,
    response_mask: Any = None,
    step: int | None = None,
    groups: Mapping[str, Any] | None = None,
    uid: Any = None,
    advantages: Any = None,
    process_index: int | None = None,
    policy_version: Any = None,
    token_ids: Any = None,
    dtype: str = "float32",
) -> Path:
    """Write one batch of `[B, T]` trainer / rollout log-probs and mask as a wide parquet dump; returns its path.

    `data` is a verl `DataProto` (or any object or dict with `batch` and `meta_info`) or a dict of
    tensors; the keywords give or override single tensors. `step` defaults to `meta_info["global_steps"]`.
    `path` is a folder (one `step_{step:06d}.parquet` per call; `dump_{n:06d}.parquet` without a step;
    a call for an existing step replaces its file) or a `.parquet` file. `groups` adds per-row label
    columns for `--by NAME`, `uid` per-row sequence ids, `advantages` a per-token `[B, T]` or per-row `[B]`
    advantage (prime-rl's replay masks on its sign), `process_index` the rank of the process writing the
    rows (TRL's replay averages per process first), `policy_version` the policy version each row was sampled
    with (`[B]` or one integer; the policy-lag evidence), `token_ids` the sampled ids `[B, T]` (the repetition
    evidence). Log-probs are stored as `dtype` (float32 or
    float64), the mask as int8, each row at its full padded length (the padding is masked out).
    """
    import pyarrow as pa
    import pyarrow.parquet as pq

    from mismatch_cli.system.output import streamed_file

    if dtype not in FLOAT_DTYPES:
        raise UsageError(f"write_dump: unknown dtype {dtype!r}", hint="use float32 or float64")
    if not isinstance(path, (str, os.PathLike)) or isinstance(os.fspath(path), bytes):
        raise UsageError(f"write_dump: path must be a folder or .parquet file name, got {path!r}",
                         hint="pass path='dumps/' or a str / pathlib.Path")
    given = {"old_log_probs": old_log_probs, "rollout_log_probs": rollout_log_probs, "response_mask": response_mask}
    tensors, meta = _unpack(data) if data is not None else ({}, {})
    arrays = {role: as_array(given[role] if given[role] is not None else _pick(tensors, role), role)
              for role in ROLES}
    old, rollout, mask = (arrays[role] for role in ROLES)
    _check(old, rollout, mask)
    rows, width = old.shape
    number = _step(step, meta)
    float_type = pa.float32() if dtype == "float32" else pa.float64()

    def column(values: np.ndarray, arrow_type: pa.DataType, numpy_type: type) -> pa.Array:
        flat = pa.array(np.ascontiguousarray(values, dtype=numpy_type).reshape(-1), type=arrow_type)
        return pa.FixedSizeListArray.from_arrays(flat, width)

    columns = {"old_log_probs": column(old, float_type, np.dtype(dtype).type),
               "rollout_log_probs": column(rollout, float_type, np.dtype(dtype).type),
               "response_mask": column(mask, pa.int8(), np.int8)}
    if number is not None:
        columns["step"] = pa.array(np.full(rows, number, dtype=np.int64))
    if uid is not None:
        columns["uid"] = _labels(uid, "uid", rows)
    if process_index is not None:
        if isinstance(process_index, bool) or not isinstance(process_index, (int, np.integer)) \
                or not 0 <= process_index < 2 ** 63:
            raise UsageError(f"write_dump: process_index must be an integer >= 0 (below 2^63), got {process_index!r}",
                             hint="pass process_index=self.accelerator.process_index (or leave it out)")
        columns["process_index"] = pa.array(np.full(rows, int(process_index), dtype=np.int64))
    if policy_version is not None:
        versions = as_array(policy_version, "policy_version")
        if versions.dtype.kind not in "iu" or versions.shape not in ((), (rows,)):
            raise UsageError(f"write_dump: policy_version must be one integer or one per row ({rows}), got "
                             f"{versions.dtype} {tuple(versions.shape)}",
                             hint="pass the weight version each row was sampled with, e.g. [3, 3, 2, ...]")
        versions = np.broadcast_to(versions, (rows,))
        columns["policy_version"] = pa.array(versions.astype(np.int64))
    if token_ids is not None:
        ids = as_array(token_ids, "token_ids")
        if ids.shape != (rows, width) or ids.dtype.kind not in "iu":
            raise UsageError(f"write_dump: token_ids must be integers shaped like the log-probs {(rows, width)}, "
                             f"got {ids.dtype} {tuple(ids.shape)}", hint="pass the sampled response ids [B, T]")
        columns["response_ids"] = column(ids, pa.int64(), np.int64)
    if advantages is not None:
        columns["advantages"] = _advantages(as_array(advantages, "advantages"), rows, width, column, float_type, dtype)
    if groups is not None and not isinstance(groups, Mapping):
        raise UsageError(f"write_dump: groups is a {type(groups).__name__}, not a mapping",
                         hint="pass groups={'env_name': [one label per row]}")
    for name, values in (groups or {}).items():
        if not isinstance(name, str):
            raise UsageError(f"write_dump: group column names must be strings, got {name!r}",
                             hint="pass groups={'env_name': [one label per row]}")
        if name in columns:
            raise UsageError(f"write_dump: group column {name!r} clashes with a column of the layout",
                             hint="name the group column something else")
        columns[name] = _labels(values, name, rows)
    table = pa.table(columns)
    target = _target(path, number)
    with streamed_file(target, "write_dump") as tmp:
        pq.write_table(table, tmp, row_group_size=ROW_GROUP, compression="zstd", write_page_checksum=True)
    return target


__all__ = ["FLOAT_DTYPES", "ROLES", "STEP_KEYS", "as_array", "write_dump"]
