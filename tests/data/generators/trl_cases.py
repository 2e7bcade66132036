"""Parity cases for TRL's vLLM importance-sampling correction, produced by TRL's own code.

Run by hand, never by CI or the tests, with the interpreter of a scratch venv that holds TRL:

    python3 -m venv SCRATCH/trl-venv
    SCRATCH/trl-venv/bin/pip install torch==2.13.0   # the CPU wheel
    SCRATCH/trl-venv/bin/pip install trl==1.16.0
    SCRATCH/trl-venv/bin/python tests/data/generators/trl_cases.py tests/data/trl_parity_cases.json

TRL computes the correction and its metrics inline in `GRPOTrainer._generate_and_score_completions`, not in a
function of its own. This script therefore takes the two blocks that hold them out of the *installed* module's
syntax tree (two of the `if self.use_vllm and self.vllm_importance_sampling_correction:` statements: one builds the
ratio, a later one logs the `sampling/*` metrics), compiles them unchanged under their original file name and
line numbers, and executes them in the module's own globals (torch, math, TRL's `nanmin` / `nanmax`) with a stub
`self`. Nothing of TRL's arithmetic is re-written here. The settings go through TRL's own `GRPOConfig` (its
defaults, its deprecation of `vllm_importance_sampling_cap`, its validation errors), then onto the stub `self` as
`GRPOTrainer.__init__` copies them.

Several processes: TRL gathers one scalar per process per key (`accelerator.gather`) and reduces the gathered
vector. The script runs every process's rows once to record those scalars, then again with a `gather` that
returns all processes' scalars stacked in process order (what accelerate's `gather` returns for a 0-d tensor);
every process must then log the same values.
"""

from __future__ import annotations

import ast
import hashlib
import inspect
import json
import re
import sys
import types
import warnings
from collections import defaultdict
from pathlib import Path

import numpy as np
import torch
import trl
import trl.trainer.grpo_trainer as grpo_module
from casefile import encode as _encode
from casefile import f32 as _f32
from casefile import mask as _mask
from trl import GRPOConfig

GUARD = "self.use_vllm and self.vllm_importance_sampling_correction"
METHOD = "GRPOTrainer._generate_and_score_completions"
FIELDS = (
    "vllm_importance_sampling_mode",
    "vllm_importance_sampling_clip_max",
    "vllm_importance_sampling_clip_min",
)
DTYPES = {"fp32": torch.float32, "fp64": torch.float64}


def _trl_blocks() -> tuple[types.CodeType, types.CodeType, dict]:
    """The ratio block and the metrics block of the installed TRL, compiled as they stand, with provenance."""
    path = inspect.getsourcefile(grpo_module)
    source = Path(path).read_text()
    tree = ast.parse(source)
    cls = next(n for n in tree.body if isinstance(n, ast.ClassDef) and n.name == "GRPOTrainer")
    method = next(n for n in cls.body if isinstance(n, ast.FunctionDef) and n.name == "_generate_and_score_completions")
    guarded = [n for n in ast.walk(method) if isinstance(n, ast.If) and ast.unparse(n.test) == GUARD]
    ratio_blocks = [n for n in guarded if "vllm_importance_sampling_ratio = torch.exp" in ast.unparse(n)]
    metrics_blocks = [n for n in guarded if "sampling/importance_sampling_ratio/mean" in ast.unparse(n)]
    if len(ratio_blocks) != 1 or len(metrics_blocks) != 1:
        raise SystemExit(f"expected one ratio block and one metrics block guarded by `{GUARD}` in {METHOD}, found "
                         f"{len(ratio_blocks)} and {len(metrics_blocks)}: TRL changed")
    (ratio_block,), (metrics_block,) = ratio_blocks, metrics_blocks
    codes, provenance = [], []
    for role, node in (("ratio", ratio_block), ("metrics", metrics_block)):
        segment = ast.get_source_segment(source, node)
        codes.append(compile(ast.Module(body=[node], type_ignores=[]), path, "exec"))
        provenance.append({
            "role": role,
            "lines": [node.lineno, node.end_lineno],
            "sha256": hashlib.sha256(segment.encode()).hexdigest(),
        })
    return codes[0], codes[1], {"file": "trl/trainer/grpo_trainer.py", "method": METHOD, "blocks": provenance}


RATIO_CODE, METRICS_CODE, BLOCKS = _trl_blocks()


class _Accelerator:
    """`gather` as accelerate returns it for a 0-d tensor: a vector with one entry per process, in process order."""

    def __init__(self, gathered: list[list[torch.Tensor]] | None, rank: int) -> None:
        self.gathered, self.rank, self.calls, self.local = gathered, rank, 0, []

    def gather(self, tensor: torch.Tensor) -> torch.Tensor:
        self.local.append(tensor.detach().clone())
        if self.gathered is None:  # first pass: only this process's scalar
            result = tensor.clone()[None]
        else:
            # torch.stack promotes dtypes: TRL's 0.0 fallback for an empty selection is float32 even in a fp64 run.
            values = [process[self.calls] for process in self.gathered]
            result = torch.stack([v.to(torch.promote_types(v.dtype, values[0].dtype)) for v in values])
        self.calls += 1
        return result


def _config(settings: dict) -> GRPOConfig:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return GRPOConfig(output_dir="/tmp/trl-cases", report_to="none", use_cpu=True, bf16=False, **settings)


def _run_process(config: GRPOConfig, old, rollout, mask, gathered, rank) -> tuple[dict, _Accelerator]:
    """One process of TRL: its rows through TRL's ratio block, then its metrics block."""
    trainer = types.SimpleNamespace(
        use_vllm=True,
        vllm_importance_sampling_correction=config.vllm_importance_sampling_correction,
        **{field: getattr(config, field) for field in FIELDS},
        accelerator=_Accelerator(gathered, rank),
        _metrics={"train": defaultdict(list)},
    )
    namespace = dict(vars(grpo_module))
    namespace.update(
        self=trainer,
        old_per_token_logps=old,
        sampling_per_token_logps=rollout,
        completion_mask=mask,
        tool_mask=None,
        device=torch.device("cpu"),
        mode="train",
    )
    exec(RATIO_CODE, namespace)
    exec(METRICS_CODE, namespace)
    metrics = {key: values[-1] for key, values in sorted(trainer._metrics["train"].items())}
    return {"weights": namespace["vllm_importance_sampling_ratio"], "log_ratio": namespace["logps_diff"],
            "metrics": metrics}, trainer.accelerator


def _outputs(settings: dict, old, rollout, mask, processes, dtype) -> dict:
    try:
        config = _config(settings)
        old_t = torch.tensor(old, dtype=dtype)
        rollout_t = torch.tensor(rollout, dtype=dtype)
        mask_t = torch.tensor(mask, dtype=torch.long)  # TRL pads the completion mask from integer lists
        shards = processes or [list(range(len(old)))]
        first = [_run_process(config, old_t[rows], rollout_t[rows], mask_t[rows], None, rank)[1].local
                 for rank, rows in enumerate(shards)]
        results = [_run_process(config, old_t[rows], rollout_t[rows], mask_t[rows], first, rank)[0]
                   for rank, rows in enumerate(shards)]
    except (ValueError, TypeError) as error:
        return {"error": type(error).__name__, "message": str(error)}
    metrics = results[0]["metrics"]
    for other in results[1:]:
        assert json.dumps(_encode(list(other["metrics"].values()))) == json.dumps(_encode(list(metrics.values())))
    order = torch.tensor([row for rows in shards for row in rows]).argsort()
    weights = torch.cat([r["weights"] for r in results])[order]
    log_ratio = torch.cat([r["log_ratio"] for r in results])[order]
    return {
        "weights": _encode(weights),
        "log_ratio": _encode(log_ratio),
        "metrics": {key: _encode(float(value)) for key, value in metrics.items()},
    }


def _base(seed: int = 23, lengths=(8, 6, 3, 1), width: int = 8, scale: float = 0.45):
    rng = np.random.default_rng(seed)
    mask = _mask(lengths, width)
    old = rng.uniform(-3.0, -0.05, size=(len(lengths), width))
    rollout = np.minimum(old - rng.normal(0.1, scale, size=old.shape), -0.01)  # a log-prob stays below 0
    rollout = np.where(np.asarray(mask) == 1, rollout, 0.0)  # TRL right-pads the vLLM log-probs with 0.0
    return _f32(old), _f32(rollout), mask


MODES = ("token_truncate", "token_mask", "sequence_truncate", "sequence_mask")


def _cases() -> list[dict]:
    cases = []

    def add(name, settings, inputs, processes=None):
        old, rollout, mask = inputs
        assert processes is None or sorted(sum(processes, [])) == list(range(len(old))), name
        cases.append({"name": name, "settings": settings, "old_log_prob": old, "rollout_log_prob": rollout,
                      "response_mask": mask, "processes": processes})

    base = _base()
    add("defaults", {}, base)
    for mode in MODES:
        add(f"{mode}_default_bounds", {"vllm_importance_sampling_mode": mode}, base)
        add(f"{mode}_band", {"vllm_importance_sampling_mode": mode, "vllm_importance_sampling_clip_min": 0.8,
                             "vllm_importance_sampling_clip_max": 1.25}, base)
        add(f"{mode}_min_only", {"vllm_importance_sampling_mode": mode, "vllm_importance_sampling_clip_min": 0.9,
                                 "vllm_importance_sampling_clip_max": None}, base)
    add("deprecated_cap", {"vllm_importance_sampling_mode": "sequence_truncate",
                           "vllm_importance_sampling_cap": 1.5}, base)
    add("mask_without_bounds", {"vllm_importance_sampling_mode": "token_mask",
                                "vllm_importance_sampling_clip_max": None}, base)

    # An empty row among valid ones; then a batch with no valid token at all.
    old, rollout, _ = _base(seed=5)
    empty_row = (old, [r if i != 2 else [0.0] * 8 for i, r in enumerate(rollout)], _mask((8, 5, 0, 2), 8))
    all_empty = (old, [[0.0] * 8 for _ in old], _mask((0, 0, 0, 0), 8))
    for mode in MODES:
        add(f"empty_row_{mode}", {"vllm_importance_sampling_mode": mode}, empty_row)
        add(f"all_empty_{mode}", {"vllm_importance_sampling_mode": mode}, all_empty)

    # Catastrophic tokens: |Δ| = 25, and a rollout log-prob of -inf (Δ = +inf, which TRL's nan_to_num turns into
    # the dtype's largest finite number before exp).
    old, rollout, mask = _base(seed=7)
    rollout[0][2] = old[0][2] - 25.0
    rollout[1][1] = old[1][1] + 25.0
    rollout[2][0] = float("-inf")
    catastrophic = (old, rollout, mask)
    for mode in MODES:
        add(f"catastrophic_{mode}", {"vllm_importance_sampling_mode": mode}, catastrophic)

    # exp(ΣΔ) overflow: ΣΔ = 100 overflows float32 only, ΣΔ = 800 overflows float64 too; a row with +inf and
    # -inf tokens sums to max + min = 0 after nan_to_num.
    width = 40
    overflow = (
        [[-1.0] * width, [-1.0] * width, [-1.0] * width, [-1.0] * width],
        [[-3.5] * width, [-1.0 - 20.0] * width, [-1.0] * width, [-1.2] * width],
        _mask((40, 40, 40, 5), width),
    )
    overflow[1][2][3], overflow[0][2][4] = float("-inf"), float("-inf")
    for mode in MODES:
        add(f"overflow_{mode}", {"vllm_importance_sampling_mode": mode}, overflow)
    add("overflow_sequence_truncate_min_only", {"vllm_importance_sampling_mode": "sequence_truncate",
                                                "vllm_importance_sampling_clip_min": 0.5,
                                                "vllm_importance_sampling_clip_max": None}, overflow)
    add("overflow_sequence_mask_min_only", {"vllm_importance_sampling_mode": "sequence_mask",
                                            "vllm_importance_sampling_clip_min": 0.5,
                                            "vllm_importance_sampling_clip_max": None}, overflow)
    add("overflow_token_truncate_min_only", {"vllm_importance_sampling_mode": "token_truncate",
                                             "vllm_importance_sampling_clip_min": 0.5,
                                             "vllm_importance_sampling_clip_max": None}, overflow)

    # Tokens vLLM could not score (NaN rollout log-prob), and non-finite values in the padding.
    old, rollout, mask = _base(seed=11)
    rollout[0][3], rollout[1][0] = float("nan"), float("nan")
    old[2][5], rollout[2][6], rollout[3][4] = float("nan"), float("inf"), float("-inf")  # all in padding
    for mode in MODES:
        add(f"nan_and_padding_{mode}", {"vllm_importance_sampling_mode": mode}, (old, rollout, mask))

    # Ratios exactly on the bound are kept by the mask modes.
    on_bound = ([[-1.0, -2.0, -0.5], [-0.25, -1.5, -3.0]], [[-1.0, -2.0, -0.5], [-0.25, -1.5, -3.0]],
                _mask((3, 2), 3))
    for mode in MODES:
        add(f"on_bound_{mode}", {"vllm_importance_sampling_mode": mode, "vllm_importance_sampling_clip_min": 1.0,
                                 "vllm_importance_sampling_clip_max": None} if mode.endswith("truncate") else
            {"vllm_importance_sampling_mode": mode, "vllm_importance_sampling_clip_max": 1.0}, on_bound)

    # The length effect (trl#4772): a mean Δ of about 0.012 over 128 tokens puts exp(ΣΔ) near e^1.5 > 3.
    rng = np.random.default_rng(4772)
    old = rng.uniform(-2.5, -0.05, size=(3, 128))
    rollout = old - rng.normal(0.012, 0.02, size=old.shape)
    length = (_f32(old), _f32(rollout), _mask((128, 64, 16), 128))
    add("length_effect_sequence_mask", {}, length)
    add("length_effect_token_truncate", {"vllm_importance_sampling_mode": "token_truncate"}, length)

    # Several processes: a mean of per-process means, a min of mins, a max of maxes.
    add("two_processes_defaults", {}, base, [[0, 1], [2, 3]])
    add("two_processes_token_truncate", {"vllm_importance_sampling_mode": "token_truncate"}, base, [[0, 1], [2, 3]])
    add("uneven_processes_token_mask", {"vllm_importance_sampling_mode": "token_mask",
                                        "vllm_importance_sampling_clip_max": 1.25}, base, [[0], [1, 2, 3]])
    add("process_without_tokens_token_truncate", {"vllm_importance_sampling_mode": "token_truncate"}, empty_row,
        [[0, 1, 3], [2]])
    add("process_without_tokens_sequence_mask", {}, empty_row, [[0, 1, 3], [2]])
    add("three_processes_catastrophic", {"vllm_importance_sampling_mode": "sequence_truncate"}, catastrophic,
        [[0], [1], [2, 3]])

    # Settings TRL refuses: two from GRPOConfig.__post_init__, one from the ratio block itself.
    add("ERR_min_not_below_max", {"vllm_importance_sampling_clip_min": 3.0}, base)
    add("ERR_truncate_without_bounds", {"vllm_importance_sampling_mode": "token_truncate",
                                        "vllm_importance_sampling_clip_max": None}, base)
    add("ERR_unknown_mode", {"vllm_importance_sampling_mode": "token"}, base)
    return cases


def main(out: str) -> None:
    cases = _cases()
    for case in cases:
        inputs = (case["old_log_prob"], case["rollout_log_prob"], case["response_mask"], case["processes"])
        for label, dtype in DTYPES.items():
            case[label] = _outputs(case["settings"], *inputs, dtype)
        try:
            config = _config(case["settings"])
            case["resolved"] = {field: getattr(config, field) for field in FIELDS}
        except ValueError:
            case["resolved"] = None
        case["old_log_prob"] = _encode(case["old_log_prob"])
        case["rollout_log_prob"] = _encode(case["rollout_log_prob"])
        if case["processes"] is None:
            del case["processes"]
    defaults = _config({})
    document = {
        "trl_version": trl.__version__,
        "torch_version": torch.__version__,
        "source": BLOCKS,
        "settings_class": "trl.trainer.grpo_config.GRPOConfig",
        "defaults": {"vllm_importance_sampling_correction": defaults.vllm_importance_sampling_correction,
                     **{field: getattr(defaults, field) for field in FIELDS}},
        "cases": cases,
    }
    text = json.dumps(document, indent=1, allow_nan=False)
    # One line per row of numbers, so a case reads as its [B, T] arrays.
    text = re.sub(r"\[\s+([^\[\]{}]*?)\s+\]", lambda m: "[" + re.sub(r",\s+", ", ", m[1]) + "]", text)
    Path(out).write_text(text + "\n")
    print(f"{len(cases)} cases -> {out}")


if __name__ == "__main__":
    main(sys.argv[1] if len(sys.argv) > 1 else "tests/data/trl_parity_cases.json")
