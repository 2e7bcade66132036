"""Parity cases for SkyRL's off-policy correction, produced by SkyRL's own code.

Run by hand, never by CI or the tests. SkyRL 0.4.0 needs Python >= 3.12 to install and pulls in ray, vllm and
more, so the functions are read straight out of the wheel (`pip download` fetches it whatever the interpreter):

    python3 -m venv SCRATCH/venv && SCRATCH/venv/bin/pip install torch==2.13.0     # the CPU wheel
    SCRATCH/venv/bin/pip download skyrl==0.4.0 --no-deps --python-version 3.12 --only-binary=:all: -d SCRATCH
    SCRATCH/venv/bin/python tests/data/generators/skyrl_cases.py SCRATCH/skyrl-0.4.0-py3-none-any.whl \
        tests/data/skyrl_parity_cases.json

The script parses three files of the wheel with `ast`, takes the named functions (and one constant) unchanged,
compiles them under their original file names and executes them in a namespace holding torch, math and typing
(with `DictConfig` a plain name: it is only an annotation). Nothing of SkyRL's arithmetic is re-written here:

- off_policy_correction_utils.py: `compute_off_policy_correction` and the functions it calls;
- torch_utils.py: `masked_mean`, `safe_exp_delta`;
- workers/worker_utils.py: `reduce_metrics` (and `MEAN_LOSS_METRICS`), which the worker applies over its
  micro-batches and the trainer again over mini-batches and epochs (one mini-batch, one epoch here).

The defaults come from the `OffPolicyCorrectionConfig` and `TrainerConfig` dataclasses of config.py, read from the
syntax tree (`ast.literal_eval` of each field's default). One process: the DP all-reduce of one rank is the value
itself. The correction config is a `SimpleNamespace` (the functions read attributes only). The loss mask is a float
tensor of the compute dtype, as SkyRL's batches carry it. Each micro-batch is `micro_train_batch_size_per_gpu`
consecutive rows in case order (SkyRL's sample-based `BatchIterator`), padded to the case's width. The worker
prefixes each key with `loss_metrics/`, the trainer with `policy/`.
"""

from __future__ import annotations

import ast
import hashlib
import math
import re
import sys
import types
import typing
import zipfile
from collections import defaultdict
from pathlib import Path

import numpy as np
import torch
from casefile import encode as _encode
from casefile import f32 as _f32
from casefile import mask as _mask
from casefile import write_cases

UTILS = "skyrl/backends/skyrl_train/utils/off_policy_correction_utils.py"
TORCH_UTILS = "skyrl/backends/skyrl_train/utils/torch_utils.py"
WORKER_UTILS = "skyrl/backends/skyrl_train/workers/worker_utils.py"
CONFIG = "skyrl/train/config/config.py"
FUNCTIONS = {
    UTILS: ("off_policy_correction_enabled", "compute_tis_ratio", "compute_outlier_token_mask", "compute_token_mask",
            "compute_sequence_mask", "compute_off_policy_correction"),
    TORCH_UTILS: ("masked_mean", "safe_exp_delta"),
    WORKER_UTILS: ("reduce_metrics",),
}
CONSTANTS = {WORKER_UTILS: ("MEAN_LOSS_METRICS",)}
DTYPES = {"fp32": torch.float32, "fp64": torch.float64}
MICRO = "micro_train_batch_size_per_gpu"


def _load(wheel: Path) -> tuple[dict, dict, dict]:
    """SkyRL's functions, compiled unchanged from the wheel; its defaults; the provenance of each function."""
    namespace = {"torch": torch, "math": math, "DictConfig": object, "Optional": typing.Optional,
                 "Tuple": tuple, "Dict": dict, "List": list}  # annotations only
    provenance = {}
    with zipfile.ZipFile(wheel) as archive:
        sources = {name: archive.read(name).decode() for name in (*FUNCTIONS, CONFIG)}
        version = next(n for n in archive.namelist() if n.endswith(".dist-info/METADATA"))
        version = re.search(r"^Version: (.+)$", archive.read(version).decode(), re.M)[1]
    for path, names in FUNCTIONS.items():
        source = sources[path]
        tree = ast.parse(source)
        for node in tree.body:
            wanted = isinstance(node, ast.FunctionDef) and node.name in names
            constant = isinstance(node, ast.Assign) and any(
                isinstance(t, ast.Name) and t.id in CONSTANTS.get(path, ()) for t in node.targets)
            if not (wanted or constant):
                continue
            exec(compile(ast.Module(body=[node], type_ignores=[]), path, "exec"), namespace)
            if wanted:
                segment = ast.get_source_segment(source, node)
                provenance[node.name] = {"file": path, "lines": [node.lineno, node.end_lineno],
                                         "sha256": hashlib.sha256(segment.encode()).hexdigest()}
        missing = [n for n in names if n not in namespace]
        if missing:
            raise SystemExit(f"{path} of the wheel lacks {missing}: SkyRL changed")
    defaults = {}
    for node in ast.parse(sources[CONFIG]).body:
        if isinstance(node, ast.ClassDef) and node.name in ("OffPolicyCorrectionConfig", "TrainerConfig"):
            for item in node.body:
                if isinstance(item, ast.AnnAssign) and isinstance(item.target, ast.Name) and item.value is not None:
                    if node.name == "OffPolicyCorrectionConfig" or item.target.id == MICRO:
                        defaults[item.target.id] = ast.literal_eval(item.value)
    return namespace, defaults, {"skyrl_version": version, "functions": provenance,
                                 "wheel_sha256": hashlib.sha256(wheel.read_bytes()).hexdigest()}


def _outputs(skyrl: dict, defaults: dict, settings: dict, old, rollout, mask, dtype) -> dict:
    values = {**defaults, **settings}
    size = values.pop(MICRO)
    config = types.SimpleNamespace(**values)
    old_t, rollout_t = torch.tensor(old, dtype=dtype), torch.tensor(rollout, dtype=dtype)
    mask_t = torch.tensor(mask, dtype=dtype)
    worker = defaultdict(list)
    try:
        for start in range(0, len(old), size):  # the worker's micro-batches, then reduce_metrics over them
            rows = slice(start, start + size)
            _, metrics, _ = skyrl["compute_off_policy_correction"](old_t[rows], rollout_t[rows], mask_t[rows], config)
            for key, value in metrics.items():
                worker["loss_metrics/" + key].append(value)
    except ValueError as error:
        return {"error": type(error).__name__, "message": str(error)}
    per_worker = skyrl["reduce_metrics"](worker, sum_loss_metrics=True)
    trainer = skyrl["reduce_metrics"]({k: [v] for k, v in per_worker.items()}, sum_loss_metrics=False)
    return {"metrics": {"policy/" + k: _encode(float(v)) for k, v in sorted(trainer.items())},
            "micro_batches": {k: _encode(list(map(float, v))) for k, v in sorted(worker.items())}}


def _base(seed: int = 29, lengths=(8, 6, 3, 1, 7, 5), width: int = 8, scale: float = 0.3):
    rng = np.random.default_rng(seed)
    mask = _mask(lengths, width)
    old = rng.uniform(-3.0, -0.05, size=(len(lengths), width))
    rollout = np.minimum(old - rng.normal(0.02, scale, size=old.shape), -0.01)
    rollout = np.where(np.asarray(mask) == 1, rollout, 0.0)
    old = np.where(np.asarray(mask) == 1, old, 0.0)  # SkyRL pads both log-prob tensors with 0
    return _f32(old), _f32(rollout), mask


def _cases() -> list[dict]:
    cases = []

    def add(name, settings, inputs):
        old, rollout, mask = inputs
        cases.append({"name": name, "settings": settings, "old_log_prob": old, "rollout_log_prob": rollout,
                      "response_mask": mask})

    base = _base()
    add("defaults_off", {}, base)
    add("token_tis_default_cap", {"tis_ratio_type": "token"}, base)
    add("token_tis_cap_1_2", {"tis_ratio_type": "token", "token_tis_ratio_clip_high": 1.2}, base)
    add("sequence_tis_default_cap", {"tis_ratio_type": "sequence"}, base)
    add("sequence_tis_cap_1_5", {"tis_ratio_type": "sequence", "sequence_tis_ratio_clip_high": 1.5}, base)
    add("geometric_default_band", {"sequence_mask_metric": "geometric"}, base)
    add("geometric_wide_band", {"sequence_mask_metric": "geometric", "geo_mask_low": 0.9, "geo_mask_high": 1.1}, base)
    add("product_default_band", {"sequence_mask_metric": "product"}, base)
    add("product_narrow_band", {"sequence_mask_metric": "product", "product_mask_low": 0.8,
                                "product_mask_high": 1.25}, base)
    add("outlier_high_only", {"outlier_token_is_threshold_high": 2.0}, base)
    add("outlier_low_only", {"outlier_token_is_threshold_low": 0.6}, base)
    add("outlier_both_with_token_tis", {"tis_ratio_type": "token", "outlier_token_is_threshold_low": 0.6,
                                        "outlier_token_is_threshold_high": 2.0}, base)
    add("token_mask_band", {"token_mask_is_threshold_low": 0.8, "token_mask_is_threshold_high": 1.25}, base)
    add("token_mask_one_bound_is_off", {"token_mask_is_threshold_high": 1.25}, base)
    add("token_mask_then_token_tis", {"tis_ratio_type": "token", "token_tis_ratio_clip_high": 1.1,
                                      "token_mask_is_threshold_low": 0.7, "token_mask_is_threshold_high": 1.5}, base)
    everything = {"tis_ratio_type": "sequence", "sequence_tis_ratio_clip_high": 1.3,
                  "sequence_mask_metric": "geometric", "geo_mask_low": 0.95, "geo_mask_high": 1.05,
                  "outlier_token_is_threshold_low": 0.3, "outlier_token_is_threshold_high": 3.0,
                  "token_mask_is_threshold_low": 0.6, "token_mask_is_threshold_high": 1.6}
    add("everything", everything, base)
    for size in (2, 4, 16):  # 4: a short last micro-batch; 16: one micro-batch holds every row
        add(f"micro_batch_{size}_token_tis", {"tis_ratio_type": "token", MICRO: size}, base)
        add(f"micro_batch_{size}_everything", {**everything, MICRO: size}, base)

    # An empty row among valid ones; then a batch with no valid token at all.
    old, rollout, _ = _base(seed=5)
    mask = _mask((8, 5, 0, 2, 8, 1), 8)
    empty_row = (old, rollout, mask)
    all_empty = (old, rollout, _mask((0,) * 6, 8))
    for name, settings in (("token_tis", {"tis_ratio_type": "token"}), ("sequence_tis", {"tis_ratio_type": "sequence"}),
                           ("geometric", {"sequence_mask_metric": "geometric"}), ("everything", everything)):
        add(f"empty_row_{name}", settings, empty_row)
        add(f"empty_row_{name}_micro_batch_3", {**settings, MICRO: 3}, empty_row)
        add(f"all_empty_{name}", settings, all_empty)

    # Rows of one token, one position wide: the std of one element is NaN in every micro-batch of one row.
    single = (_f32([[-1.0], [-0.5], [-2.0]]), _f32([[-1.2], [-0.5], [-1.0]]), [[1], [1], [1]])
    add("one_token_rows_width_1", {"tis_ratio_type": "token"}, single)
    add("one_token_rows_width_1_micro_batch_3", {"tis_ratio_type": "token", MICRO: 3}, single)

    # Catastrophic tokens: |d| = 25 (clamped to 20 before exp), and a rollout log-prob of -inf (d = +inf).
    old, rollout, mask = _base(seed=7)
    rollout[0][2] = old[0][2] - 25.0
    rollout[1][1] = old[1][1] + 25.0
    rollout[2][0] = float("-inf")
    catastrophic = (old, rollout, mask)
    for name, settings in (("token_tis", {"tis_ratio_type": "token"}), ("sequence_tis", {"tis_ratio_type": "sequence"}),
                           ("product", {"sequence_mask_metric": "product"}),
                           ("outlier_sequence_tis", {"tis_ratio_type": "sequence",
                                                     "outlier_token_is_threshold_low": 1e-4,
                                                     "outlier_token_is_threshold_high": 100.0}),
                           ("token_mask_geometric", {"sequence_mask_metric": "geometric",
                                                     "token_mask_is_threshold_low": 0.5,
                                                     "token_mask_is_threshold_high": 2.0}),
                           ("everything_micro_batch_2", {**everything, MICRO: 2})):
        add(f"catastrophic_{name}", settings, catastrophic)

    # Long rows: the sum of log-ratios far beyond 20 (exp would overflow without the clamp).
    width = 64
    long_rows = ([[-1.0] * width] * 4, [[-1.5] * width, [-1.0 + 0.5] * width, [-1.01] * width, [-1.0] * width],
                 _mask((64, 64, 64, 10), width))
    for name, settings in (("sequence_tis", {"tis_ratio_type": "sequence"}),
                           ("product", {"sequence_mask_metric": "product"}),
                           ("geometric", {"sequence_mask_metric": "geometric"})):
        add(f"long_rows_{name}", settings, long_rows)

    # NaN rollout log-probs on valid tokens; NaN / inf in the padding.
    old, rollout, mask = _base(seed=11)
    rollout[0][3] = float("nan")
    nan_tokens = ([r[:] for r in old], [r[:] for r in rollout], mask)
    old[2][5], rollout[3][4], rollout[5][6] = float("nan"), float("inf"), float("-inf")  # all in the padding
    nan_padding = (old, rollout, mask)
    for name, settings in (("token_tis", {"tis_ratio_type": "token"}), ("sequence_tis", {"tis_ratio_type": "sequence"}),
                           ("token_mask", {"token_mask_is_threshold_low": 0.5, "token_mask_is_threshold_high": 2.0}),
                           ("geometric_micro_batch_2", {"sequence_mask_metric": "geometric", MICRO: 2})):
        add(f"nan_tokens_{name}", settings, nan_tokens)
        add(f"nan_padding_{name}", settings, nan_padding)

    # Ratios exactly on a bound: strict comparisons keep them (float32 exp(0) = 1 exactly).
    on_bound = ([[-1.0, -2.0, -0.5], [-0.25, -1.5, 0.0]], [[-1.0, -2.0, -0.5], [-0.25, -1.5, 0.0]], _mask((3, 2), 3))
    add("on_bound_token_tis", {"tis_ratio_type": "token", "token_tis_ratio_clip_high": 1.0}, on_bound)
    add("on_bound_sequence_tis", {"tis_ratio_type": "sequence", "sequence_tis_ratio_clip_high": 1.0}, on_bound)
    add("on_bound_token_mask", {"token_mask_is_threshold_low": 1.0, "token_mask_is_threshold_high": 1.0}, on_bound)
    add("on_bound_geometric", {"sequence_mask_metric": "geometric", "geo_mask_low": 1.0, "geo_mask_high": 1.0},
        on_bound)
    add("on_bound_outlier", {"outlier_token_is_threshold_low": 1.0, "outlier_token_is_threshold_high": 1.0}, on_bound)

    # Settings SkyRL refuses (the compute functions' ValueError; validate_cfg asserts the same earlier).
    add("ERR_unknown_tis_ratio_type", {"tis_ratio_type": "tok"}, base)
    add("ERR_unknown_sequence_mask_metric", {"sequence_mask_metric": "mean"}, base)
    return cases


def main(wheel: str, out: str) -> None:
    skyrl, defaults, provenance = _load(Path(wheel))
    cases = _cases()
    for case in cases:
        inputs = (case["old_log_prob"], case["rollout_log_prob"], case["response_mask"])
        for label, dtype in DTYPES.items():
            case[label] = _outputs(skyrl, defaults, case["settings"], *inputs, dtype)
        case["old_log_prob"] = _encode(case["old_log_prob"])
        case["rollout_log_prob"] = _encode(case["rollout_log_prob"])
    document = {
        **provenance,
        "torch_version": torch.__version__,
        "settings_classes": "skyrl.train.config.config.OffPolicyCorrectionConfig (+ TrainerConfig."
                            "micro_train_batch_size_per_gpu)",
        "defaults": defaults,
        "cases": cases,
    }
    write_cases(document, out)
    print(f"{len(cases)} cases -> {out}")


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2] if len(sys.argv) > 2 else "tests/data/skyrl_parity_cases.json")
