"""slime train-side debug dumps (`--save-debug-train-data`, `--dump-details DIR/train_data/{id}.pt`).

`format_version` 2: `{"format_version": 2, "rollout_id", "rank", "samples": [...], "dp_shards": [...]}`,
one dict per sample with ragged response-length tensors `log_probs` (trainer), `rollout_log_probs`,
`loss_masks`, plus `response_lengths` and `rollout_position`; the dump written before version 2
(`{"rollout_id", "rank", "rollout_data": {key: [per-sample values]}}`) is read too; it is also the layout
Miles (radixark/miles) writes to `--dump-details DIR/train_data/{rollout_id}_{rank}.pt`, plus `cp_rank`, `cp_size`
and `qkv_format` (a context-parallel rank's slice is refused, as is Miles's per-call `policy_loss_debug/` file).
Files are loaded with `torch.load(weights_only=True)` only, never with full unpickling; the rollout-side dump
(`rollout_data/{id}.pt`), which holds pickled `Sample` objects and no trainer log-probs, is refused
before anything is loaded. torch is imported inside the reader, never when `mismatch_cli.io` is.
"""

from __future__ import annotations

import errno
import math
import os
import warnings
import zipfile
from collections.abc import Iterator
from typing import Any

import numpy as np

from ..errors import InputError
from ._common import check_file, missing_group, reason
from .aliases import resolve_roles
from .detect import slime_kind
from .options import ReadOptions
from .validate import Column, Decoded, PerRow

TRAIN_SIDE = (
    "the train-side dump written by --save-debug-train-data PATH or --dump-details DIR "
    "(DIR/train_data/{rollout_id}.pt), which holds both log-probs and loads without unpickling"
)
_READ_HINT = "check that the file is complete; re-save it with torch.save if it was truncated or written another way"
_ORDER_KEYS = ("rollout_position", "sample_index")
_LENGTHS_HINT = ("re-save the dump with response_lengths as whole numbers, one per sample, as slime writes them "
                 "(e.g. int(len(response)), not a string)")


def rollout_refusal(path: str) -> InputError:
    """The error for a slime rollout-side dump: why it is not read, and what to read instead."""
    return InputError(
        f"{path} is a slime rollout-side dump (--save-debug-rollout-data, or rollout_data/ under "
        "--dump-details): it has no trainer log-probs, and loading it needs full unpickling of slime's "
        "Sample objects, which mismatch never does (unpickling can run arbitrary code)",
        hint=f"analyze {TRAIN_SIDE}",
    )


def _unpickling_reason(exc: BaseException) -> str:
    # torch's message is long and suggests weights_only=False; keep only the line saying what was refused.
    for line in str(exc).splitlines():
        if "GLOBAL" in line or "Unsupported" in line or "unsupported" in line:
            return line.strip().rstrip(".")
    return "the file holds Python objects other than tensors, numbers, strings, lists and dicts"


def _load(path: str) -> Any:
    import pickle

    import torch

    if os.path.getsize(path) == 0:
        raise InputError(f"cannot read {path} as a torch file: the file is empty (0 bytes)",
                         hint="re-save the dump (an interrupted save or a full disk leaves an empty file), or leave "
                         "this file out of the inputs")
    zipped = zipfile.is_zipfile(path)
    try:
        with warnings.catch_warnings():  # torch warns on stderr about a plain pickle's protocol: one error line only
            warnings.simplefilter("ignore", UserWarning)
            return torch.load(path, map_location="cpu", weights_only=True, mmap=zipped)
    except pickle.UnpicklingError as exc:
        raise InputError(
            f"cannot load {path} with torch.load(weights_only=True): {_unpickling_reason(exc)}; mismatch never "
            "unpickles arbitrary Python objects (that can run code)",
            hint=f"if this is a slime rollout-side dump, analyze {TRAIN_SIDE}; otherwise re-save the dump with "
            "tensors, numbers, strings, lists and dicts only",
        ) from None
    # A damaged file trips torch's readers in many ways (garbage bytes make its pickle stack pop empty: IndexError).
    except (RuntimeError, OSError, EOFError, ValueError, KeyError, IndexError, TypeError, AttributeError,
            zipfile.BadZipFile) as exc:
        raise InputError(f"cannot read {path} as a torch file: {_damage(exc)}", hint=_READ_HINT) from None


def _damage(exc: BaseException) -> str:
    """What torch.load's failure on a damaged file says, in a short clause (its own text is long, empty or a key)."""
    text = reason(exc).split(". This is an internal miniz error")[0].split(". The file might be corrupted")[0]
    if isinstance(exc, EOFError) or "unexpected EOF" in text:
        return "its data ends early (the file is truncated)"
    if isinstance(exc, OSError) and exc.errno == errno.EINVAL:  # torch's zip reader on an archive cut short
        return "its zip archive is cut short (the file is truncated)"
    if "Invalid magic number" in text:
        return "it was not written by torch.save (a plain pickle or another format: invalid magic number)"
    if isinstance(exc, (KeyError, IndexError)) or not text:
        # the legacy (pre-zip) loader reads the first bytes as a pickle: garbage there fails as a bare key or a pop
        return (f"its bytes are neither a torch zip archive nor a torch pickle ({type(exc).__name__}: "
                f"{text or 'no detail'})")
    return text


def _legacy_samples(data: dict[str, Any], path: str) -> list[dict[str, Any]]:
    """Per-sample dicts from the pre-version-2 layout (a dict of per-sample lists)."""
    lengths = data.get("response_lengths", ())
    if not (isinstance(lengths, (list, tuple)) or getattr(lengths, "ndim", None) == 1):
        raise InputError(
            f"expected 'response_lengths' in {path} (rollout_data) to be a list of integers, one per sample, got "
            f"{_shown(lengths)}", hint=_LENGTHS_HINT)
    count = len(lengths)
    for key, value in data.items():
        if isinstance(value, (list, tuple)) and len(value) != count:
            raise InputError(
                f"expected one entry per sample in key {key!r} of {path} (rollout_data), got {len(value)} for "
                f"{count} samples (response_lengths)", hint="dump every per-sample list for every sample")
    columns = {key: value for key, value in data.items() if _is_per_sample(value, count)}
    return [{key: value[i] for key, value in columns.items()} for i in range(count)]


def _is_per_sample(value: Any, count: int) -> bool:
    if isinstance(value, (list, tuple)):
        return len(value) == count
    shape = getattr(value, "shape", None)
    return shape is not None and len(shape) >= 1 and shape[0] == count


def _samples(payload: Any, path: str) -> tuple[list[dict[str, Any]], dict[str, Any]]:
    if not isinstance(payload, dict):
        raise InputError(
            f"expected a dict saved by slime in {path}, got {type(payload).__name__}",
            hint=f"analyze {TRAIN_SIDE}",
        )
    meta = {key: _scalar(payload[key]) for key in ("rollout_id", "rank") if key in payload}
    if "samples" in payload and "call" in payload and "ppo_kl" in payload:
        raise InputError(
            f"{path} is a Miles policy-loss debug dump (policy_loss_debug/ under --dump-details): one file per loss "
            "call and micro-batch, whose 'old_log_probs' are the rollout's under --use-rollout-logprobs",
            hint="analyze the train-side dump of the same --dump-details folder, DIR/train_data/{rollout_id}_{rank}.pt",
        )
    cp_size = _scalar(payload.get("cp_size", 1))
    if isinstance(cp_size, bool) or not isinstance(cp_size, int):  # Miles writes an int; 2.0 or "2" is no dump of it
        raise InputError(
            f"{path}: cp_size must be a whole number, as Miles writes it, got {cp_size!r} ({type(cp_size).__name__})",
            hint="re-dump with Miles' --dump-details, or write the whole samples with write_dump (docs/python-api.md)",
        )
    if cp_size > 1:
        raise InputError(
            f"{path} holds context-parallel rank {_scalar(payload.get('cp_rank'))}'s slice of each sample (cp_size "
            f"{cp_size}): Miles dumps each rank's zigzag slice of the per-token log-probs, and mismatch reads whole "
            "samples",
            hint="dump from a run with --context-parallel-size 1, or write the whole samples with write_dump "
            "(docs/python-api.md)",
        )
    if "samples" in payload:
        if "format_version" not in payload:  # slime's rollout side: samples but no version and no trainer side
            raise rollout_refusal(path)
        samples = payload["samples"]
        if not isinstance(samples, list) or not all(isinstance(s, dict) for s in samples):
            raise InputError(
                f"expected 'samples' in {path} to be a list of per-sample dicts, got {type(samples).__name__}",
                hint=f"analyze {TRAIN_SIDE}",
            )
        return samples, meta
    if isinstance(payload.get("rollout_data"), dict):
        return _legacy_samples(payload["rollout_data"], path), meta
    keys = ", ".join(sorted(map(str, payload))[:20]) or "(none)"
    raise InputError(
        f"{path} is not a slime train dump: expected 'format_version' and 'samples', got keys {keys}",
        hint=f"analyze {TRAIN_SIDE}",
    )


def _scalar(value: Any) -> Any:
    if hasattr(value, "item") and getattr(value, "ndim", 1) == 0:
        return value.item()
    return value


def _values(value: Any) -> np.ndarray | None:
    """A per-sample array as numpy (bf16/f16 widened to float32), or None."""
    if value is None:
        return None
    if hasattr(value, "detach"):  # a torch tensor; torch is already imported by _load
        tensor = value.detach().cpu().reshape(-1)
        if tensor.dtype.is_floating_point and tensor.element_size() < 4:
            tensor = tensor.float()
        return tensor.numpy()
    return np.asarray(value).reshape(-1)


def _sample_values(row: dict[str, Any], key: str, path: str, rows: list[dict[str, Any]], j: int,
                   first_row: int) -> np.ndarray | None:
    """One sample's values under `key`, or InputError when they are not one flat list of numbers."""
    try:
        return _values(row.get(key))
    except (ValueError, TypeError):
        raise InputError(f"expected one list of numbers per sample in key {key!r}, got {_shown(row.get(key))} "
                         f"in {path} {_row_name(rows, j, first_row)}",
                         hint="dump one flat tensor or list per sample for each role") from None


def _order(samples: list[dict[str, Any]]) -> list[int]:
    """Sample order by `rollout_position` (fallback `sample_index`), as slime sorts them; else as stored."""
    for key in _ORDER_KEYS:
        keys = [_scalar(s.get(key)) for s in samples]
        if keys and all(isinstance(k, int) for k in keys):
            return sorted(range(len(samples)), key=keys.__getitem__)
    return list(range(len(samples)))


def decode_slime(path: str, options: ReadOptions) -> Iterator[Decoded]:
    """Stream a slime train-side dump as decoded chunks of at most `chunk_rows` samples, in rollout order."""
    check_file(path)
    if slime_kind(path) == "rollout":
        raise rollout_refusal(path)
    samples, meta = _samples(_load(path), path)
    if not samples:
        return
    available = [str(k) for k in samples[0]]
    roles = resolve_roles(available, options, path, noun="key")
    names = {role: name for role, name in roles.items() if name is not None}
    for column in options.group_columns:
        if column not in samples[0] and column not in meta:
            raise missing_group(column, path, [*available, *meta], noun="key")
    order = _order(samples)
    # Miles's train dump (slime's pre-version-2 layout) names each sample's Sample.index `sample_indices`.
    id_key = next((k for k in ("sample_index", "rollout_position", "sample_indices")
                   if _scalar(samples[0].get(k)) is not None), None)
    step = meta.get("rollout_id")
    if isinstance(step, float) and step.is_integer():
        step = int(step)
    if step is not None and (not isinstance(step, int) or isinstance(step, bool)):
        raise InputError(f"expected an integer rollout_id (the training step) in {path}, got {_shown(step)}",
                         hint="save rollout_id as the integer step slime passes to its dump")
    for a in range(0, len(order), options.chunk_rows):
        rows = [samples[i] for i in order[a : a + options.chunk_rows]]
        yield _decode(rows, names, meta, step, id_key, options.group_columns, path, a)


def _shown(value: Any) -> str:
    """A value as an error message shows it: its type, and the value itself when short."""
    text = repr(value)
    return f"{type(value).__name__} {text}" if len(text) <= 40 else type(value).__name__


def _response_length(value: Any, path: str, rows: list[dict[str, Any]], j: int, first_row: int) -> int:
    """A sample's `response_lengths`: a whole number (an int as slime writes it, or a one-element tensor)."""
    if getattr(value, "ndim", None) == 1 and getattr(value, "shape", (0,))[0] == 1:
        value = value[0]
    value = _scalar(value)
    if isinstance(value, (int, np.integer)) and not isinstance(value, bool):
        return int(value)
    if isinstance(value, (float, np.floating)) and float(value).is_integer():
        return int(value)
    raise InputError(
        f"expected an integer number of response tokens in key 'response_lengths', got {_shown(value)} in {path} "
        f"{_row_name(rows, j, first_row)}", hint=_LENGTHS_HINT)


def _row_name(rows: list[dict[str, Any]], j: int, first_row: int) -> str:
    position = _scalar(rows[j].get("rollout_position"))
    return f"row {first_row + j}" + (f" (rollout_position {position})" if position is not None else "")


def _version_number(value: Any) -> float:
    """One SGLang weight version (an int, or its decimal string) as a float; NaN when it is not a number."""
    value = _scalar(value)
    try:
        return float(int(str(value).strip()))
    except ValueError:
        return math.nan


def _weight_versions(rows: list[dict[str, Any]]) -> Column | None:
    """Each sample's oldest weight version (Miles forwards `weight_versions`, one per turn, into the train data),
    or None when no sample carries one."""
    if not any("weight_versions" in row or "oldest_weight_version" in row for row in rows):
        return None
    oldest = []
    for row in rows:
        value = row.get("oldest_weight_version", row.get("weight_versions"))
        values = [_version_number(v) for v in value] if isinstance(value, (list, tuple)) else [_version_number(value)]
        known = [v for v in values if not math.isnan(v)]
        oldest.append(min(known) if known else math.nan)
    return Column(np.array(oldest, dtype=np.float64), None, "weight_versions")


def _decode(
    rows: list[dict[str, Any]],
    names: dict[str, str],
    meta: dict[str, Any],
    step: Any,
    id_key: str | None,
    group_columns: tuple[str, ...],
    path: str,
    first_row: int,
) -> Decoded:
    """One chunk of samples as flat streams. Ragged per-sample tensors are checked one by one before they are
    joined (an integer sample among float ones would be upcast, a short mask shifted into the next sample)."""
    parts: dict[str, list[np.ndarray]] = {}
    for role in ("old_log_probs", "rollout_log_probs"):
        name = names[role]
        values = [_sample_values(row, name, path, rows, j, first_row) for j, row in enumerate(rows)]
        missing = [j for j, v in enumerate(values) if v is None]
        if missing:
            raise InputError(
                f"expected {role} in key {name!r}, got none in {path} {_row_name(rows, missing[0], first_row)}",
                hint="dump with rollout log-probs recorded (slime keeps them when the engine returns log-probs)",
            )
        # Per sample, before concatenating: one integer sample among float ones would be upcast silently.
        integers = [j for j, v in enumerate(values) if v.dtype.kind != "f"]
        if integers:
            j = integers[0]
            raise InputError(
                f"expected float log-probs for {role} in key {name!r}, got {values[j].dtype} (token ids?) in {path} "
                f"{_row_name(rows, j, first_row)}",
                hint=f"point --column {role}=KEY at the key holding the log-probs",
            )
        parts[role] = values  # type: ignore[assignment]
    lengths = np.array([len(v) for v in parts["old_log_probs"]], dtype=np.int64)
    checks = {names[r]: np.array([len(v) for v in parts[r]], dtype=np.int64) for r in parts if r != "old_log_probs"}
    if "response_mask" in names:
        masks = [_sample_values(row, names["response_mask"], path, rows, j, first_row) for j, row in enumerate(rows)]
        # slime's loss_mask None means every response token is trained on.
        parts["response_mask"] = [
            np.ones(n, np.int8) if m is None else m for m, n in zip(masks, lengths.tolist(), strict=True)
        ]
        checks[names["response_mask"]] = np.array([len(m) for m in parts["response_mask"]], dtype=np.int64)
    if all("response_lengths" in row for row in rows):
        checks["response_lengths"] = np.array([_response_length(row["response_lengths"], path, rows, j, first_row)
                                               for j, row in enumerate(rows)], np.int64)
    for name, other in checks.items():
        bad = other != lengths
        if bad.any():
            j = int(np.argmax(bad))
            raise InputError(
                f"expected equal lengths in {path} {_row_name(rows, j, first_row)}, got {int(lengths[j])} tokens in "
                f"key {names['old_log_probs']!r} and {int(other[j])} in {name!r}",
                hint="every role must hold one value per response token of the same sample",
            )
    offsets = np.concatenate([[0], np.cumsum(lengths)]).astype(np.int64)
    roles = {role: Column(np.concatenate(values), offsets, names[role]) for role, values in parts.items()}
    count = len(rows)
    groups = {}
    for column in group_columns:
        labels = np.empty(count, dtype=object)
        labels[:] = [_scalar(row.get(column, meta.get(column))) for row in rows]
        groups[column] = PerRow(labels, f"{path} key {column!r}")
    versions = _weight_versions(rows)
    return Decoded(
        source=path,
        first_row=first_row,
        old_log_probs=roles["old_log_probs"],
        rollout_log_probs=roles["rollout_log_probs"],
        response_mask=roles.get("response_mask"),
        policy_versions=versions,
        version_kind="version" if versions is not None else "",
        noun="key",
        steps=PerRow(step, path, "step (rollout_id)") if isinstance(step, int) else None,
        sequence_ids=np.array([_scalar(row.get(id_key)) for row in rows]) if id_key else None,
        groups=groups,
    )
