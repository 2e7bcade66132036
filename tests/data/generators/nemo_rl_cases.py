"""Parity cases for NeMo-RL's mismatch metrics, produced by NeMo-RL's own `ClippedPGLossFn`.

Run by hand, never by CI or the tests, with the interpreter of a scratch venv that holds torch and pydantic:

    python3 -m venv SCRATCH/venv
    SCRATCH/venv/bin/pip install torch==2.13.0 numpy pydantic   # the CPU torch wheel
    SCRATCH/venv/bin/python tests/data/generators/nemo_rl_cases.py NEMO_RL_GIT_DIR tests/data/nemo_rl_parity_cases.json

NEMO_RL_GIT_DIR is a clone (bare is fine) of github.com/NVIDIA-NeMo/RL holding commit `COMMIT` below; NeMo-RL
has no usable PyPI release (`nemo-rl` 0.0.0 is a placeholder). Importing `nemo_rl` pulls in ray, megatron and
transformers, so this script reads the three files at the pinned commit with `git show`, takes out of their syntax
trees the definitions the loss needs (`ClippedPGLossConfig`, `ClippedPGLossDataDict`, `ClippedPGLossFn` from
`loss_functions.py`; `masked_mean`, `calculate_kl` from `algorithms/utils.py`; the enums and the `LossFunction`
protocol from `loss/interfaces.py`), compiles each unchanged under its original file name and line numbers, and
executes them in one namespace holding torch, pydantic's `BaseModel` and a stub `BatchedDataDict` (a dict: the
loss only indexes it, calls `.get` and tests `in`). Nothing of NeMo-RL's arithmetic is re-written here.

What the script does write is the plumbing around one call, as NeMo-RL's policy worker does it for one global
batch holding one micro-batch (`nemo_rl/models/automodel/data.py:process_global_batch`): the global valid
sequence and token counts as a float32 tensor of two sums, the loss called once, and the metric divided by the
number of global batches (1) and summed over micro-batches (one) as `grpo.py` does. The loss needs more inputs
than a dump has; they get neutral values, recorded in the JSON (`neutral_inputs`): NeMo's tensors carry one
leading position that the loss drops (`[:, 1:]`), filled with 0 and mask 0; the current policy's log-probs equal
the old ones (`prev_logprobs`), so do the reference policy's; advantages are 0; every row has sample_mask 1.
Only the mismatch metrics (`KEYS`) are recorded.
"""

from __future__ import annotations

import ast
import enum
import hashlib
import subprocess
import sys
import types
from typing import Any, NotRequired, Optional, Protocol, TypedDict, TypeVar

import numpy as np
import pydantic
import torch
from casefile import encode as _encode
from casefile import f32 as _f32
from casefile import mask as _mask
from casefile import write_cases
from pydantic import BaseModel

COMMIT = "7ea279abfbeb698b092856d0dab61e7cf39bc909"
SOURCES = {
    "nemo_rl/algorithms/loss/interfaces.py": ("LossType", "MetricNormalizer", "LossInputType", "LossFunction"),
    "nemo_rl/algorithms/utils.py": ("calculate_kl", "masked_mean"),
    "nemo_rl/algorithms/loss/loss_functions.py": ("ClippedPGLossConfig", "ClippedPGLossDataDict", "ClippedPGLossFn"),
}
KEYS = ("token_mult_prob_error", "gen_kl_error", "policy_kl_error", "js_divergence_error",
        "sampling_importance_ratio", "is_oob_ratio")
FIELDS = ("reference_policy_kl_type", "use_importance_sampling_correction", "truncated_importance_sampling_type",
          "truncated_importance_sampling_ratio", "truncated_importance_sampling_ratio_min",
          "sequence_level_importance_ratios", "token_level_loss")
DTYPES = {"fp32": torch.float32, "fp64": torch.float64}


class BatchedDataDict(dict):
    """Stand-in for nemo_rl.distributed.batched_data_dict.BatchedDataDict (a UserDict upstream)."""


def _load(git_dir: str) -> tuple[dict, list[dict]]:
    module = types.ModuleType("nemo_rl_loss")  # pydantic resolves annotations through sys.modules
    sys.modules[module.__name__] = module
    namespace: dict[str, Any] = module.__dict__
    namespace.update({
        "torch": torch, "enum": enum, "Any": Any, "NotRequired": NotRequired,
        "Optional": Optional, "Protocol": Protocol, "TypedDict": TypedDict, "TypeVar": TypeVar,
        "BaseModel": BaseModel, "BatchedDataDict": BatchedDataDict,
    })
    namespace["Tensor"] = TypeVar("Tensor", bound=torch.Tensor)
    provenance = []
    for path, names in SOURCES.items():
        source = subprocess.run(["git", "-C", git_dir, "show", f"{COMMIT}:{path}"], check=True,
                                capture_output=True, text=True).stdout
        tree = ast.parse(source)
        found = {n.name: n for n in tree.body if isinstance(n, (ast.ClassDef, ast.FunctionDef)) and n.name in names}
        missing = set(names) - set(found)
        if missing:
            raise SystemExit(f"{path} at {COMMIT} lacks {sorted(missing)}: NeMo-RL changed")
        for name in names:
            node = found[name]
            exec(compile(ast.Module(body=[node], type_ignores=[]), path, "exec"), namespace)
            segment = ast.get_source_segment(source, node)
            provenance.append({"file": path, "name": name, "lines": [node.lineno, node.end_lineno],
                               "sha256": hashlib.sha256(segment.encode()).hexdigest()})
    return namespace, provenance


NEMO, PROVENANCE = _load(sys.argv[1]) if __name__ == "__main__" else ({}, [])


def _global_counts(token_mask: torch.Tensor, sample_mask: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """The two normalizers as process_global_batch forms them (one data-parallel rank: the all-reduce is a no-op)."""
    local_valid_seqs = torch.sum(sample_mask)
    local_valid_toks = torch.sum(token_mask[:, 1:] * sample_mask.unsqueeze(-1))
    to_reduce = torch.tensor([local_valid_seqs, local_valid_toks])
    return to_reduce[0], to_reduce[1]


def _shifted(values: torch.Tensor) -> torch.Tensor:
    """NeMo's [B, T+1] layout: one leading position the loss drops with `[:, 1:]`."""
    return torch.cat([torch.zeros_like(values[:, :1]), values], dim=1)


def _outputs(settings: dict, old, rollout, mask, dtype) -> dict:
    try:
        config = NEMO["ClippedPGLossConfig"](**settings)
        loss_fn = NEMO["ClippedPGLossFn"](config)
        old_t, rollout_t = torch.tensor(old, dtype=dtype), torch.tensor(rollout, dtype=dtype)
        token_mask = _shifted(torch.tensor(mask, dtype=torch.long))  # ones_like(token_ids): int64
        sample_mask = torch.ones(len(old), dtype=torch.float32)  # loss_multiplier: float32
        prev = _shifted(old_t)
        data = BatchedDataDict(
            input_ids=torch.zeros_like(token_mask),
            advantages=torch.zeros_like(prev),
            prev_logprobs=prev,
            generation_logprobs=_shifted(rollout_t),
            reference_policy_logprobs=prev.clone(),
            token_mask=token_mask,
            sample_mask=sample_mask,
        )
        global_valid_seqs, global_valid_toks = _global_counts(token_mask, sample_mask)
        _, metrics = loss_fn(old_t.clone(), data, global_valid_seqs, global_valid_toks)
    except (AssertionError, ValueError, pydantic.ValidationError) as error:
        return {"error": type(error).__name__, "message": str(error)}
    num_global_batches = 1
    logged = {key: float(np.sum([metrics[key] / num_global_batches])) for key in KEYS if key in metrics}
    return {"metrics": {key: _encode(value) for key, value in logged.items()}}


def _base(seed: int = 29, lengths=(8, 6, 3, 1), width: int = 8, scale: float = 0.3):
    rng = np.random.default_rng(seed)
    mask = _mask(lengths, width)
    old = rng.uniform(-3.0, -0.05, size=(len(lengths), width))
    rollout = np.minimum(old - rng.normal(0.02, scale, size=old.shape), -0.01)
    rollout = np.where(np.asarray(mask) == 1, rollout, 0.0)  # NeMo pads generation log-probs with 0.0
    old = np.where(np.asarray(mask) == 1, old, 0.0)
    return _f32(old), _f32(rollout), mask


IS_ON = {"use_importance_sampling_correction": True}
SEQ = {"sequence_level_importance_ratios": True, "token_level_loss": False}
TIS_SETTINGS = {
    "tis_max_only": {**IS_ON, "truncated_importance_sampling_type": "tis", "truncated_importance_sampling_ratio": 1.5},
    "tis_band": {**IS_ON, "truncated_importance_sampling_type": "tis", "truncated_importance_sampling_ratio": 1.25,
                 "truncated_importance_sampling_ratio_min": 0.8},
    "icepop": {**IS_ON, "truncated_importance_sampling_type": "icepop", "truncated_importance_sampling_ratio": 1.5,
               "truncated_importance_sampling_ratio_min": 0.7},
    "seq_mask_tis": {**IS_ON, "truncated_importance_sampling_type": "seq-mask-tis",
                     "truncated_importance_sampling_ratio": 1.1, "truncated_importance_sampling_ratio_min": 0.9},
    "seq_mask_tis_tight": {**IS_ON, "truncated_importance_sampling_type": "seq-mask-tis",
                           "truncated_importance_sampling_ratio": 1.002,
                           "truncated_importance_sampling_ratio_min": 0.999},
}


def _cases() -> list[dict]:
    cases = []

    def add(name, settings, inputs):
        old, rollout, mask = inputs
        cases.append({"name": name, "settings": settings, "old_log_prob": old, "rollout_log_prob": rollout,
                      "response_mask": mask})

    base = _base()
    add("defaults", {}, base)
    for kl in ("k1", "k2"):
        add(f"kl_{kl}", {"reference_policy_kl_type": kl}, base)
    add("is_correction_on", dict(IS_ON), base)
    for name, settings in TIS_SETTINGS.items():
        add(name, settings, base)
    add("sequence_level", {**IS_ON, **SEQ}, base)
    add("sequence_level_tis", {**TIS_SETTINGS["tis_band"], **SEQ}, base)
    add("sequence_level_icepop", {**TIS_SETTINGS["icepop"], **SEQ}, base)
    add("sequence_level_metric_without_correction", dict(SEQ), base)

    # An empty row (mask all 0) among valid ones, and a row with one token.
    old, rollout, _ = _base(seed=5)
    mask = _mask((8, 5, 0, 1), 8)
    rollout = [[v if m else 0.0 for v, m in zip(r, mr, strict=True)] for r, mr in zip(rollout, mask, strict=True)]
    old = [[v if m else 0.0 for v, m in zip(r, mr, strict=True)] for r, mr in zip(old, mask, strict=True)]
    empty_row = (old, rollout, mask)
    for name, settings in (("defaults", {}), ("tis_band", TIS_SETTINGS["tis_band"]),
                           ("seq_mask_tis", TIS_SETTINGS["seq_mask_tis"]),
                           ("sequence_level", {**IS_ON, **SEQ}), ("sequence_level_icepop",
                                                                 {**TIS_SETTINGS["icepop"], **SEQ})):
        add(f"empty_and_one_token_rows_{name}", settings, empty_row)

    # Catastrophic tokens: |d| = 25 both ways (exp(25) survives float32; exp(-25) is tiny).
    old, rollout, mask = _base(seed=7)
    rollout[0][2] = old[0][2] - 25.0
    rollout[1][1] = old[1][1] + 25.0
    catastrophic = (old, rollout, mask)
    for name, settings in (("defaults", {}), ("kl_k2", {"reference_policy_kl_type": "k2"}),
                           ("tis_max_only", TIS_SETTINGS["tis_max_only"]), ("icepop", TIS_SETTINGS["icepop"]),
                           ("seq_mask_tis", TIS_SETTINGS["seq_mask_tis"]), ("sequence_level", {**IS_ON, **SEQ})):
        add(f"catastrophic_{name}", settings, catastrophic)

    # exp overflow: |d| = 100 overflows exp in float32 only (token_mult_prob_error, k3), d summed over 40 tokens
    # (sequence level) overflows float64 too; NeMo's nan_to_num turns an infinite weight into 0.
    width = 40
    overflow = (
        [[-1.0] * width, [-1.0] * width, [-1.0] * width, [-1.0] * width],
        [[-3.5] * width, [-1.0 - 20.0] * width, [-1.0] * width, [-1.2] * width],
        _mask((40, 40, 40, 5), width),
    )
    overflow[1][3] = [-1.2] * 5 + [0.0] * 35
    overflow[0][3] = [-1.0] * 5 + [0.0] * 35
    for name, settings in (("defaults", {}), ("sequence_level", {**IS_ON, **SEQ}),
                           ("sequence_level_tis", {**TIS_SETTINGS["tis_band"], **SEQ}),
                           ("tis_max_only", TIS_SETTINGS["tis_max_only"]),
                           ("seq_mask_tis", TIS_SETTINGS["seq_mask_tis"])):
        add(f"overflow_{name}", settings, overflow)
    single_overflow = ([[-1.0, -1.0, -1.0], [-1.0, -2.0, -1.0]], [[-101.0, -1.0, -1.0], [-1.5, -2.0, -0.5]],
                       _mask((3, 3), 3))
    for name, settings in (("defaults", {}), ("tis_max_only", TIS_SETTINGS["tis_max_only"]),
                           ("icepop", TIS_SETTINGS["icepop"])):
        add(f"exp_overflow_token_{name}", settings, single_overflow)

    # Non-finite log-probs on masked-in tokens: NaN (a token the engine could not score) and -inf.
    old, rollout, mask = _base(seed=11)
    rollout[0][3] = float("nan")
    nan_case = (old, rollout, mask)
    old, rollout, mask = _base(seed=13)
    rollout[1][2] = float("-inf")
    ninf_case = (old, rollout, mask)
    for name, settings in (("defaults", {}), ("kl_k1", {"reference_policy_kl_type": "k1"}),
                           ("tis_band", TIS_SETTINGS["tis_band"]), ("icepop", TIS_SETTINGS["icepop"]),
                           ("seq_mask_tis", TIS_SETTINGS["seq_mask_tis"]), ("sequence_level", {**IS_ON, **SEQ})):
        add(f"nan_rollout_{name}", settings, nan_case)
        add(f"neg_inf_rollout_{name}", settings, ninf_case)

    # Weights exactly on a bound (d = 0: weight 1).
    on_bound = ([[-1.0, -2.0, -0.5], [-0.25, -1.5, -3.0]], [[-1.0, -2.0, -0.5], [-0.25, -1.5, -3.0]],
                _mask((3, 2), 3))
    add("on_bound_tis", {**IS_ON, "truncated_importance_sampling_type": "tis",
                         "truncated_importance_sampling_ratio": 1.0}, on_bound)
    add("on_bound_icepop", {**IS_ON, "truncated_importance_sampling_type": "icepop",
                            "truncated_importance_sampling_ratio": 1.0,
                            "truncated_importance_sampling_ratio_min": 1.0}, on_bound)
    add("on_bound_seq_mask_tis", {**IS_ON, "truncated_importance_sampling_type": "seq-mask-tis",
                                  "truncated_importance_sampling_ratio": 1.0,
                                  "truncated_importance_sampling_ratio_min": 1.0}, on_bound)

    # A longer batch: the sequence-level metric as NeMo reduces it grows with the number of rows.
    rng = np.random.default_rng(2026)
    old = rng.uniform(-2.5, -0.05, size=(6, 64))
    rollout = old - rng.normal(0.002, 0.02, size=old.shape)
    longer = (_f32(old), _f32(rollout), _mask((64, 48, 32, 16, 8, 2), 64))
    add("longer_defaults", {}, longer)
    add("longer_sequence_level", {**IS_ON, **SEQ}, longer)
    add("longer_seq_mask_tis_tight", TIS_SETTINGS["seq_mask_tis_tight"], longer)

    # Settings NeMo-RL refuses: pydantic's types, the loss's asserts, and two errors raised at the first call.
    add("ERR_tis_without_correction", {"truncated_importance_sampling_type": "tis",
                                       "truncated_importance_sampling_ratio": 2.0}, base)
    add("ERR_unknown_tis_type", {**IS_ON, "truncated_importance_sampling_type": "clip",
                                 "truncated_importance_sampling_ratio": 2.0}, base)
    add("ERR_tis_without_ratio", {**IS_ON, "truncated_importance_sampling_type": "tis"}, base)
    add("ERR_ratio_not_positive", {**IS_ON, "truncated_importance_sampling_type": "tis",
                                   "truncated_importance_sampling_ratio": 0.0}, base)
    add("ERR_min_above_ratio", {**IS_ON, "truncated_importance_sampling_type": "tis",
                                "truncated_importance_sampling_ratio": 1.5,
                                "truncated_importance_sampling_ratio_min": 2.0}, base)
    add("ERR_icepop_without_min", {**IS_ON, "truncated_importance_sampling_type": "icepop",
                                   "truncated_importance_sampling_ratio": 1.5}, base)
    add("ERR_seq_mask_tis_with_sequence_level", {**TIS_SETTINGS["seq_mask_tis"], **SEQ}, base)
    add("ERR_sequence_level_with_token_loss", {"sequence_level_importance_ratios": True}, base)
    add("ERR_unknown_kl_type", {"reference_policy_kl_type": "k4"}, base)
    add("ERR_ratio_without_type", {"truncated_importance_sampling_ratio": 2.0}, base)
    add("ERR_bool_not_bool", {"use_importance_sampling_correction": "maybe"}, base)
    return cases


def main(out: str) -> None:
    cases = _cases()
    for case in cases:
        inputs = (case["old_log_prob"], case["rollout_log_prob"], case["response_mask"])
        for label, dtype in DTYPES.items():
            case[label] = _outputs(case["settings"], *inputs, dtype)
        case["old_log_prob"] = _encode(case["old_log_prob"])
        case["rollout_log_prob"] = _encode(case["rollout_log_prob"])
    defaults = NEMO["ClippedPGLossConfig"]()
    document = {
        "nemo_rl_commit": COMMIT,
        "torch_version": torch.__version__,
        "pydantic_version": pydantic.VERSION,
        "source": PROVENANCE,
        "settings_class": "nemo_rl.algorithms.loss.loss_functions.ClippedPGLossConfig",
        "defaults": {field: getattr(defaults, field) for field in FIELDS},
        "batches": "one global batch holding one micro-batch (num_global_batches = 1), one data-parallel rank",
        "neutral_inputs": {
            "leading_position": "one extra position 0 per row (values 0.0, token_mask 0), dropped by the loss",
            "next_token_logprobs": "= prev_logprobs (the old log-probs)",
            "reference_policy_logprobs": "= prev_logprobs",
            "advantages": 0.0,
            "sample_mask": "1.0 for every row (float32)",
            "token_mask": "response_mask (int64)",
            "global_valid_seqs/toks": "float32 sums, as process_global_batch forms them",
        },
        "cases": cases,
    }
    write_cases(document, out)
    print(f"{len(cases)} cases -> {out}")


if __name__ == "__main__":
    main(sys.argv[2] if len(sys.argv) > 2 else "tests/data/nemo_rl_parity_cases.json")
