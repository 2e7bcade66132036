"""safetensors reader: padded, packed (num_tokens, cu_seqlens), bf16, metadata and error paths."""

from __future__ import annotations

import json
import struct

import numpy as np
import pytest
from safetensors.numpy import save_file

from mismatch_cli.errors import InputError
from mismatch_cli.io import ReadOptions, read_safetensors

WIDTH = 6


def _padded(rows, float_dtype=np.float32, mask_dtype=np.int64) -> dict[str, np.ndarray]:
    old, rollout, mask = rows.padded(WIDTH)
    return {
        "old_log_probs": old.astype(float_dtype),
        "rollout_log_probs": rollout.astype(float_dtype),
        "response_mask": mask.astype(mask_dtype),
    }


def _packed(rows, lengths: str = "num_tokens", float_dtype=np.float32) -> dict[str, np.ndarray]:
    old, rollout, mask, offsets = rows.flat()
    tensors = {
        "old_log_probs": old.astype(float_dtype),
        "rollout_log_probs": rollout.astype(float_dtype),
        "response_mask": mask.astype(np.int32),
    }
    if lengths == "num_tokens":
        tensors["num_tokens"] = np.diff(offsets).astype(np.int64)
    else:
        tensors["cu_seqlens"] = offsets.astype(np.int32)
    return tensors


def _save(tmp_path, tensors: dict[str, np.ndarray], name: str = "dump.safetensors", metadata=None) -> str:
    path = str(tmp_path / name)
    save_file(tensors, path, metadata=metadata)
    return path


def _save_bf16(tmp_path, tensors: dict[str, np.ndarray], name: str = "bf16.safetensors") -> str:
    """Write float tensors as BF16 by hand (numpy has no bfloat16); values must be exact in bf16."""
    header: dict = {}
    blobs: list[bytes] = []
    start = 0
    for key, array in tensors.items():
        if array.dtype.kind == "f":
            bits = (np.ascontiguousarray(array, dtype=np.float32).view(np.uint32) >> 16).astype("<u2")
            dtype, blob = "BF16", bits.tobytes()
        else:
            dtype, blob = "I64", np.ascontiguousarray(array, dtype="<i8").tobytes()
        header[key] = {"dtype": dtype, "shape": list(array.shape), "data_offsets": [start, start + len(blob)]}
        blobs.append(blob)
        start += len(blob)
    encoded = json.dumps(header).encode()
    encoded += b" " * (-len(encoded) % 8)
    path = str(tmp_path / name)
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(encoded)) + encoded + b"".join(blobs))
    return path


def _read(path: str, **options) -> list:
    return list(read_safetensors(path, ReadOptions(**options)))


def _valid(batches) -> tuple[np.ndarray, np.ndarray, list[int]]:
    """Valid-token old and rollout values and per-row valid counts (padding is mask=False)."""
    old = np.concatenate([b.old_log_probs[b.response_mask] for b in batches])
    rollout = np.concatenate([b.rollout_log_probs[b.response_mask] for b in batches])
    counts = [int(n) for b in batches for n in np.diff(np.concatenate([[0], np.cumsum(b.response_mask)])[b.offsets])]
    return old, rollout, counts


def _expected_valid(rows) -> tuple[np.ndarray, np.ndarray, list[int]]:
    old, rollout, mask, _ = rows.flat()
    return old[mask], rollout[mask], [sum(m) for m in rows.mask]


@pytest.mark.parametrize(
    "layout",
    ["padded", "padded_bool", "num_tokens", "cu_seqlens", "packed_1xn", "bf16_padded", "bf16_packed"],
)
@pytest.mark.parametrize("chunk_rows", [1, 3, 8192])
def test_every_layout_gives_the_same_valid_tokens(tmp_path, rows, concat, layout, chunk_rows):
    if layout == "padded":
        path = _save(tmp_path, _padded(rows))
    elif layout == "padded_bool":
        path = _save(tmp_path, _padded(rows, np.float64, np.bool_))
    elif layout in ("num_tokens", "cu_seqlens"):
        path = _save(tmp_path, _packed(rows, layout))
    elif layout == "packed_1xn":
        tensors = _packed(rows)
        tensors.update({k: v[None, :] for k, v in tensors.items() if k != "num_tokens"})
        path = _save(tmp_path, tensors)
    elif layout == "bf16_padded":
        path = _save_bf16(tmp_path, _padded(rows))
    else:
        path = _save_bf16(tmp_path, _packed(rows))
    batches = _read(path, chunk_rows=chunk_rows)
    assert all(b.num_rows <= chunk_rows for b in batches) and sum(b.num_rows for b in batches) == 4
    assert [b.first_row for b in batches] == list(range(0, 4, chunk_rows))
    got, want = _valid(batches), _expected_valid(rows)
    np.testing.assert_array_equal(got[0], want[0])
    np.testing.assert_array_equal(got[1], want[1])
    assert got[2] == want[2]
    expected_dtype = np.float64 if layout == "padded_bool" else np.float32
    assert all(b.old_log_probs.dtype == b.rollout_log_probs.dtype == expected_dtype for b in batches)
    assert all(b.response_mask.dtype == np.bool_ for b in batches)
    if layout in ("num_tokens", "cu_seqlens", "packed_1xn", "bf16_packed"):
        for got_array, want_array in zip(concat(batches), rows.flat(), strict=True):
            np.testing.assert_array_equal(got_array, want_array)


def test_bf16_rounding_matches_the_stored_bits(tmp_path):
    values = np.array([[-0.1, -1e-3, -20.3]], dtype=np.float32)
    bits = (values.view(np.uint32) >> 16).astype(np.uint32) << 16
    path = _save_bf16(tmp_path, {"log_probs": values, "rollout_logprobs": values, "loss_mask": np.ones((1, 3))})
    (batch,) = _read(path)
    np.testing.assert_array_equal(batch.old_log_probs, bits.view(np.float32).ravel())


def test_metadata_step_and_labels(tmp_path, rows):
    metadata = {"step": "12", "engine": "vllm-0.9", "format": "pt"}
    path = _save(tmp_path, _padded(rows), metadata=metadata)
    batches = _read(path, chunk_rows=3)
    assert [b.steps.tolist() for b in batches] == [[12, 12, 12], [12]]
    assert all(b.labels == {"engine": "vllm-0.9"} for b in batches)

    tensors = {**_padded(rows), "step": np.array(rows.steps, dtype=np.int64)}
    batches = _read(_save(tmp_path, tensors, "steps.safetensors"), chunk_rows=3)
    assert np.concatenate([b.steps for b in batches]).tolist() == rows.steps

    path = _save(tmp_path, _padded(rows), "bad_step.safetensors", metadata={"step": "twelve"})
    with pytest.raises(InputError, match=r"__metadata__\['step'\] of .*bad_step.safetensors"):
        _read(path)


def test_aliases_override_and_no_mask(tmp_path, rows):
    old, rollout, _ = rows.padded(WIDTH)
    tensors = {"old_per_token_logps": old, "sampling_per_token_logps": rollout, "other": rollout * 2}
    path = _save(tmp_path, tensors)
    with pytest.raises(InputError) as err:
        _read(path)
    message = str(err.value)
    assert "response_mask tensor" in message and "dump.safetensors" in message and "--no-mask" in message
    (batch,) = _read(path, no_mask=True)
    assert batch.response_mask.all()
    np.testing.assert_array_equal(batch.old_log_probs, old.ravel())
    (batch,) = _read(path, no_mask=True, columns={"rollout_log_probs": "other"})
    np.testing.assert_array_equal(batch.rollout_log_probs, rollout.ravel() * 2)


def test_shape_mismatch_names_file_and_tensors(tmp_path, rows):
    tensors = _padded(rows)
    tensors["rollout_log_probs"] = tensors["rollout_log_probs"][:, :-1].copy()
    with pytest.raises(InputError) as err:
        _read(_save(tmp_path, tensors))
    message = str(err.value)
    assert "dump.safetensors" in message and "'rollout_log_probs'" in message and "[4, 5]" in message


def test_mask_value_2_names_the_row(tmp_path, rows):
    tensors = _padded(rows)
    tensors["response_mask"][2, 3] = 2
    with pytest.raises(InputError, match=r"got 2 in .*dump.safetensors row 2 tensor 'response_mask' \(token 3\)"):
        _read(_save(tmp_path, tensors), chunk_rows=1)
    tensors = _packed(rows)
    tensors["response_mask"][9] = 2  # row 3, token 0
    with pytest.raises(InputError, match=r"packed.safetensors row 3 tensor 'response_mask' \(token 0\)"):
        _read(_save(tmp_path, tensors, "packed.safetensors"), chunk_rows=2)


def test_bad_num_tokens(tmp_path, rows):
    tensors = _packed(rows)
    tensors["num_tokens"][1] += 1
    with pytest.raises(InputError, match=r"'num_tokens' in .*dump.safetensors.*summing to 11.*got sum 12"):
        _read(_save(tmp_path, tensors))


@pytest.mark.parametrize(
    ("cu_seqlens", "problem"),
    [
        ([1, 3, 4, 9, 11], "starts at 1"),
        ([0, 3, 2, 9, 11], "decreases at index 2"),
        ([0, 3, 4, 9, 10], "ends at 10"),
    ],
)
def test_bad_cu_seqlens(tmp_path, rows, cu_seqlens, problem):
    tensors = _packed(rows, "cu_seqlens")
    tensors["cu_seqlens"] = np.array(cu_seqlens, dtype=np.int32)
    with pytest.raises(InputError) as err:
        _read(_save(tmp_path, tensors))
    message = str(err.value)
    assert "dump.safetensors" in message and "'cu_seqlens'" in message and problem in message


def test_packed_without_lengths_and_wrong_dtypes(tmp_path, rows):
    tensors = _packed(rows)
    del tensors["num_tokens"]
    with pytest.raises(InputError, match=r"'num_tokens' or 'cu_seqlens'.*dump.safetensors"):
        _read(_save(tmp_path, tensors))
    tensors = _padded(rows)
    tensors["old_log_probs"] = tensors["old_log_probs"].astype(np.int32)
    with pytest.raises(InputError, match=r"got I32 in .*ints.safetensors tensor 'old_log_probs'"):
        _read(_save(tmp_path, tensors, "ints.safetensors"))


def test_corrupt_truncated_and_empty(tmp_path, rows):
    garbage = tmp_path / "garbage.safetensors"
    garbage.write_bytes(b"\xff" * 64)
    with pytest.raises(InputError, match=r"cannot read .*garbage.safetensors as safetensors"):
        _read(str(garbage))
    tiny = tmp_path / "tiny.safetensors"
    tiny.write_bytes(b"\x01")
    with pytest.raises(InputError, match="tiny.safetensors"):
        _read(str(tiny))

    for writer in (_save, _save_bf16):
        path = writer(tmp_path, _padded(rows), "whole.safetensors")
        data = open(path, "rb").read()
        truncated = tmp_path / "truncated.safetensors"
        truncated.write_bytes(data[:-10])
        with pytest.raises(InputError, match="truncated.safetensors"):
            _read(str(truncated))

    with pytest.raises(InputError, match="missing.safetensors"):
        _read(str(tmp_path / "missing.safetensors"))

    empty = {k: v[:0] for k, v in _padded(rows).items()}
    assert _read(_save(tmp_path, empty, "empty.safetensors")) == []
