"""SkyRL `trainer.dump_data_batch` files: `{trainer.export_path}/dumped_data/global_step_{N}_training_input.pkl`.

`RayPPOTrainer.dump_data` pickles the step's `TrainingInputBatch` (`TensorBatch.save`, plain `pickle.dump`) after
the policy forward and the advantages, before the update. The pickle calls `_rebuild_tensor_batch(cls, state)`;
`state["batch_dict"]` maps each key to None or an encoded tensor: `{"format": "numpy", "data": bytes, "shape",
"dtype"}`, `{"format": "torch", "data": torch.save bytes}` (bfloat16 and other dtypes numpy lacks),
`{"format": "numpy_view", "data": ndarray}`, or a TensorList / PackedTensor form (images, MoE routes: not read).
Keys are `[B, T]` over the response window, right-aligned (`response_mask` 1 on the last response_len_i
positions): `action_log_probs` (trainer), `rollout_logprobs` (inference), float `loss_mask`, `advantages`.

The file is read with a restricted unpickler: SkyRL's batch classes become inert stand-ins, `torch.device`
a string, and only numpy's array rebuild and torch's tensor rebuild run; any other global is refused before it is
looked up, so nothing in the file can run code. torch is imported inside the reader, and only for a `torch`-format
field, loaded with `torch.load(weights_only=True)`.
"""

from __future__ import annotations

import io
import os
import pickle
import re
from collections.abc import Iterator
from typing import Any

import numpy as np

from ..errors import InputError
from ._common import check_file, missing_group, reason
from .aliases import ADVANTAGE_ALIASES, resolve_roles
from .options import ReadOptions
from .validate import Column, Decoded, PerRow

STEP_NAME = re.compile(r"global_step_(\d+)_")
_MODULES = ("skyrl.backends.skyrl_train.training_batch", "skyrl_train.training_batch")
_BATCH_CLASSES = ("TrainingInputBatch", "TrainingOutputBatch", "TensorBatch")
_HINT = ("analyze the files SkyRL writes with trainer.dump_data_batch=true "
         "({trainer.export_path}/dumped_data/global_step_{N}_training_input.pkl)")
_ROLL_HINT = "check that the file is complete: an interrupted dump leaves a truncated pickle; leave it out or re-run"


class _Batch:
    """Stand-in for SkyRL's TensorBatch classes: keeps the pickled state, runs nothing."""

    state: Any = None

    def __setstate__(self, state: Any) -> None:  # pre-2026-03 pickles: NEWOBJ, SETITEMS, BUILD
        self.state = state

    def __setitem__(self, key: Any, value: Any) -> None:  # their raw dict items, which the state supersedes
        pass


_STAND_INS = {name: type(name, (_Batch,), {"__module__": __name__}) for name in _BATCH_CLASSES}


def _rebuild_tensor_batch(cls: Any, state: Any) -> _Batch:
    if not (isinstance(cls, type) and issubclass(cls, _Batch)):
        raise pickle.UnpicklingError(f"_rebuild_tensor_batch of {type(cls).__name__}, not a SkyRL batch class")
    batch = cls()
    batch.state = state
    return batch


def _device(*args: Any) -> str:
    return ":".join(str(a) for a in args)


def _tensor_format(value: Any) -> str:  # SkyRL's TensorFormat StrEnum, read as its string
    return str(value)


def _load_storage(data: bytes) -> Any:
    import torch

    return torch.load(io.BytesIO(data), map_location="cpu", weights_only=True)


def _allowed(module: str, name: str) -> Any:
    """The stand-in or safe rebuild function for one pickled global, else None."""
    if module in _MODULES:
        if name in _STAND_INS:
            return _STAND_INS[name]
        if name == "_rebuild_tensor_batch":
            return _rebuild_tensor_batch
        if name == "TensorFormat":
            return _tensor_format
        return None
    if (module, name) in (("numpy._core.multiarray", "_reconstruct"), ("numpy.core.multiarray", "_reconstruct"),
                          ("numpy", "ndarray"), ("numpy", "dtype"), ("numpy._core.numeric", "_frombuffer"),
                          ("numpy.core.numeric", "_frombuffer")):
        return getattr(__import__(module, fromlist=[name]), name)
    if (module, name) == ("torch", "device"):
        return _device
    if (module, name) == ("torch.storage", "_load_from_bytes"):
        return _load_storage  # torch's own calls torch.load without weights_only
    if module == "torch._utils" and name in ("_rebuild_tensor_v2", "_rebuild_tensor"):
        import torch._utils

        return getattr(torch._utils, name)
    if (module, name) == ("collections", "OrderedDict"):  # a pickled tensor's (empty) backward hooks
        import collections

        return collections.OrderedDict
    return None


class _Unpickler(pickle.Unpickler):
    def __init__(self, handle: Any, path: str) -> None:
        super().__init__(handle)
        self.path = path

    def find_class(self, module: str, name: str) -> Any:
        found = _allowed(module, name)
        if found is None:
            raise InputError(
                f"refusing to unpickle {self.path}: it asks for {module}.{name}, which a SkyRL TrainingInputBatch "
                "dump never holds, and mismatch loads no other Python objects (unpickling can run code)",
                hint=f"{_HINT}; a pickle from elsewhere must be re-written as parquet or safetensors (write_dump)",
            )
        return found


def _short(exc: BaseException) -> str:
    """A library error's first line (torch's weights-only refusal runs over many lines)."""
    lines = reason(exc).splitlines()
    return lines[0].strip().rstrip(".:") if lines else type(exc).__name__


def _load(path: str) -> dict[str, Any]:
    """The pickled batch's state: `batch_dict`, `metadata`, ..."""
    if os.path.getsize(path) == 0:
        raise InputError(f"cannot read {path} as a SkyRL dump: the file is empty (0 bytes)", hint=_ROLL_HINT)
    try:
        with open(path, "rb") as handle:
            payload = _Unpickler(handle, path).load()
    except InputError:
        raise
    except (EOFError, pickle.UnpicklingError) as exc:
        if not isinstance(exc, EOFError) and "truncated" not in str(exc):
            raise InputError(f"cannot read {path} as a SkyRL dump: {_short(exc)}",
                             hint=_ROLL_HINT) from None
        raise InputError(f"cannot read {path} as a SkyRL dump: its pickle ends early (the file is truncated)",
                         hint=_ROLL_HINT) from None
    except (ValueError, TypeError, KeyError, IndexError, AttributeError, OSError,
            RuntimeError, MemoryError) as exc:
        raise InputError(f"cannot read {path} as a SkyRL dump: {type(exc).__name__}: {_short(exc)}",
                         hint=_ROLL_HINT) from None
    state = payload.state if isinstance(payload, _Batch) else None
    if not isinstance(state, dict) or not isinstance(state.get("batch_dict"), dict):
        got = f"a {type(payload).__name__} without its state" if isinstance(payload, _Batch) else type(payload).__name__
        raise InputError(f"expected a pickled SkyRL TrainingInputBatch in {path}, got {got}", hint=_HINT)
    return state


def _decode(value: Any, key: str, path: str) -> np.ndarray | None:
    """One batch_dict entry as a numpy array (bfloat16 / float16 widened to float32); None for None."""
    if value is None:
        return None
    try:
        if isinstance(value, (bytes, bytearray)):  # before 2026-01: each field was torch.save bytes
            return _tensor_to_numpy(_load_storage(bytes(value)))
        if not isinstance(value, dict):
            raise ValueError(f"an entry of type {type(value).__name__}")
        kind = str(value.get("format", "numpy"))
        if kind == "numpy":
            return np.frombuffer(value["data"], dtype=np.dtype(value["dtype"])).reshape(value["shape"])
        if kind == "numpy_view":
            return np.asarray(value["data"])
        if kind == "torch":
            return _tensor_to_numpy(_load_storage(value["data"]))
        raise ValueError(f"a {kind} field (per-sample tensors of varying shape, not a [B, T] tensor)")
    except InputError:
        raise
    except Exception as exc:  # noqa: BLE001 - any damage to one field is one error line naming it
        refused = _refused_global(exc)
        if refused is not None:  # torch's weights-only loader refused a global: a field that could run code
            raise InputError(f"refused key {key!r} of the SkyRL dump {path}: its torch data names the global "
                             f"{refused}, which no tensor needs; a pickle that can run code is never loaded",
                             hint="re-dump the batch with SkyRL's own writer, or write the three log-prob "
                                  "columns to parquet (docs/formats.md)") from None
        raise InputError(f"cannot decode key {key!r} of the SkyRL dump {path}: {_short(exc)}",
                         hint=_ROLL_HINT) from None


_ANSI = re.compile(r"\x1b\[[0-9;]*m")


def _refused_global(exc: BaseException) -> str | None:
    """The global torch.load(weights_only=True) refused, named in its message (ANSI codes removed), or None."""
    text = _ANSI.sub("", str(exc))
    if "Weights only load failed" not in text and "Unsupported global" not in text:
        return None
    found = re.search(r"GLOBAL ([\w.]+)", text) or re.search(r"Unsupported global: ([\w.]+)", text)
    return found.group(1) if found else "a global it does not allow"


def _tensor_to_numpy(tensor: Any) -> np.ndarray:
    if not hasattr(tensor, "detach"):
        raise ValueError(f"expected a tensor, got {type(tensor).__name__}")
    tensor = tensor.detach().cpu()
    if tensor.dtype.is_floating_point and tensor.element_size() < 4:
        tensor = tensor.float()
    return tensor.numpy()


def step_of(path: str, metadata: Any) -> int | None:
    """The step: `metadata["global_step"]` when the batch carries it, else `global_step_{N}_` in the file name."""
    if isinstance(metadata, dict) and isinstance(metadata.get("global_step"), int):
        return int(metadata["global_step"])
    match = STEP_NAME.match(os.path.basename(path))
    return int(match.group(1)) if match else None


def _refuse_none(path: str, key: str, role: str) -> InputError:
    if role == "old_log_probs":
        return InputError(
            f"{path} has {key} = None: SkyRL skipped the policy forward at this step (a policy loss that never "
            "reads old log-probs, such as rollout_is or dppo, with rollout log-probs present), so the dump holds "
            "no trainer log-probs",
            hint="turn on an off-policy correction (trainer.algorithm.off_policy_correction) or "
            "trainer.algorithm.use_kl_in_reward, or use a loss that reads old log-probs, so that SkyRL runs it",
        )
    return InputError(
        f"{path} has {key} = None: the generator returned no rollout log-probs at this step",
        hint="keep generator.sampling_params.logprobs at 0 or 1 (SkyRL's default 1) so the engine returns them",
    )


def _arrays(path: str, state: dict[str, Any], options: ReadOptions) -> tuple[dict[str, np.ndarray], dict[str, str]]:
    batch_dict = state["batch_dict"]
    keys = [str(k) for k in batch_dict]
    columns = dict(options.columns)
    if "response_mask" not in columns and "loss_mask" in batch_dict:
        columns["response_mask"] = "loss_mask"  # SkyRL's response_mask also covers tokens the loss skips
    roles = resolve_roles(keys, ReadOptions(**{**options.__dict__, "columns": columns}), path, noun="key")
    names = {role: name for role, name in roles.items() if name is not None}
    values = {}
    for role, key in names.items():
        array = _decode(batch_dict[key], key, path)
        if array is None:
            if role == "response_mask":
                raise InputError(f"{path} has {key} = None", hint="point --column response_mask=KEY at a mask")
            raise _refuse_none(path, key, role)
        values[role] = array
    advantage = next((k for k in ADVANTAGE_ALIASES if batch_dict.get(k) is not None), None)
    if advantage is not None:
        values["advantages"] = _decode(batch_dict[advantage], advantage, path)
        names["advantages"] = advantage
    if names.get("response_mask") == "response_mask":
        values["window"] = values["response_mask"]
    elif batch_dict.get("response_mask") is not None:
        values["window"] = _decode(batch_dict["response_mask"], "response_mask", path)
    shape = values["old_log_probs"].shape
    if "advantages" in values and values["advantages"].ndim == 1:
        values["advantages"] = values["advantages"].reshape(-1, 1)  # one per sample
    for role, array in values.items():
        per_row = role == "advantages" and array.ndim == 2 and array.shape[1] in (1, shape[1])
        if array.ndim != 2 or (not per_row and array.shape != shape) or array.shape[0] != shape[0]:
            raise InputError(
                f"expected [batch, response_len] tensors of one shape in {path}, got {tuple(shape)} in key "
                f"{names['old_log_probs']!r} and {tuple(array.shape)} in key {names.get(role, 'response_mask')!r}",
                hint="the keys must hold SkyRL's padded response tensors (--column ROLE=KEY picks another key)",
            )
    window = values.get("window")
    if window is not None and names.get("response_mask") != "response_mask":
        bad = (window != 0) & (window != 1)
        if bad.any():
            row, token = (int(i) for i in np.argwhere(bad)[0])
            raise InputError(f"expected response_mask values 0 or 1 (SkyRL's response window), got "
                             f"{window[row, token].item()!r} in {path} row {row} key 'response_mask' (token {token})",
                             hint="the response_mask key must mark SkyRL's response positions with 1")
    return values, names


def decode_skyrl(path: str, options: ReadOptions) -> Iterator[Decoded]:
    """Stream a SkyRL `dump_data_batch` pickle as decoded chunks of at most `chunk_rows` samples, in batch order."""
    check_file(path)
    state = _load(path)
    values, names = _arrays(path, state, options)
    metadata = state.get("metadata")
    for column in options.group_columns:
        raise missing_group(column, path, [str(k) for k in state["batch_dict"]], noun="key")
    step = step_of(path, metadata)
    count = values["old_log_probs"].shape[0]
    for a in range(0, count, options.chunk_rows):
        yield _chunk({role: array[a : a + options.chunk_rows] for role, array in values.items()}, names, step,
                        path, a)


def _chunk(values: dict[str, np.ndarray], names: dict[str, str], step: int | None, path: str,
           first_row: int) -> Decoded:
    rows, width = values["old_log_probs"].shape
    keep = np.ones((rows, width), dtype=bool)
    window = values.get("window")
    if window is not None:
        # Only the response positions: left of them the tensors hold padding (0) or, in action_log_probs, the
        # prompt's log-probs. Kept whole if the loss mask reaches outside the window (then it is not SkyRL's).
        inside = window != 0
        mask = values.get("response_mask")
        if mask is None or not ((mask != 0) & ~inside).any():
            keep = inside
    lengths = keep.sum(axis=1).astype(np.int64)
    offsets = np.concatenate([[0], np.cumsum(lengths)]).astype(np.int64)
    roles = {role: Column(values[role][keep], offsets, names[role])
             for role in ("old_log_probs", "rollout_log_probs", "response_mask") if role in values}
    advantages = None
    if "advantages" in values:
        advantage = values["advantages"]
        if advantage.shape[1] == width:
            advantages = Column(advantage[keep], offsets, names["advantages"])
        else:
            advantages = Column(advantage.reshape(rows, -1)[:, 0], None, names["advantages"])
    return Decoded(source=path, first_row=first_row, noun="key", **roles, advantages=advantages,
                   steps=None if step is None else PerRow(step, path, "step (global_step)"))
