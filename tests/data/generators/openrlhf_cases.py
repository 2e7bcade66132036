"""Parity cases for OpenRLHF's train/rollout log-prob mismatch correction, produced by OpenRLHF's own code.

Run by hand, never by CI or the tests. OpenRLHF 0.11.2's modules import ray, vllm and deepspeed, so the code is
read straight out of the wheel (`pip download` fetches it whatever the interpreter):

    python3 -m venv SCRATCH/venv && SCRATCH/venv/bin/pip install torch==2.13.0 numpy   # the CPU wheel
    SCRATCH/venv/bin/pip download openrlhf==0.11.2 --no-deps -d SCRATCH
    SCRATCH/venv/bin/python tests/data/generators/openrlhf_cases.py SCRATCH/openrlhf-0.11.2-*.whl \
        tests/data/openrlhf_parity_cases.json

The script parses two files of the wheel with `ast`, takes `PolicyLoss` (the class, unchanged: its constructor's
checks and its `forward`, which computes `vllm_kl` and `is_filter_ratio`), `aggregate_loss` and `masked_mean`,
compiles them under their original file names and executes them in a namespace holding torch and `torch.nn`.
Nothing of OpenRLHF's per-micro-batch arithmetic is re-written here. The defaults are read from the `add_argument`
calls of cli/train_ppo_ray.py (`ast.literal_eval` of each `default=`).

Written here, because they are inline in methods that need a GPU, ray and DeepSpeed to run:
- train_ppo_ray.py's `__main__` block: a one-value `--algo.advantage.is_correction_threshold` becomes
  `[0.0, value]`, and more than two values fail its assert (message copied);
- ppo_actor.py `PolicyActor.ppo_train`: micro-batches of `--train.micro_batch_size` consecutive rows (its
  DataLoader shuffles, `drop_last=True`: a short last micro-batch is dropped; case order here), one `forward` per
  micro-batch with `log_probs = old_log_probs` (the first step of the epoch) and a bool `action_mask`; each 0-d
  metric is weighted by the micro-batch's token count: `value.float().mean().item() * n_tokens`, passed through
  `strategy.all_reduce` (a float32 tensor, one process), divided by `n_tokens` (a Python float division: a
  micro-batch without a token raises ZeroDivisionError), and the per-micro-batch values averaged weighted by
  their token counts. The loggers prefix each key with `train/`.
The rows reach `forward` as OpenRLHF's replay buffer gives them: right padding stripped and re-padded with zeros
(`remove_padding_in_sequences`, `zero_pad_sequences`), so the cases store zeros in the padding.
"""

from __future__ import annotations

import ast
import hashlib
import re
import sys
import typing
import zipfile
from pathlib import Path

import numpy as np
import torch
import torch.distributed as dist
import torch.nn.functional as F  # noqa: N812
from casefile import encode as _encode
from casefile import f32 as _f32
from casefile import mask as _mask
from casefile import write_cases
from torch import nn

ROOT = "openrlhf-0.11.2.data/purelib/"
LOSS = "openrlhf/models/loss.py"
UTILS = "openrlhf/models/utils.py"
CLI = "openrlhf/cli/train_ppo_ray.py"
FUNCTIONS = {LOSS: ("aggregate_loss", "PolicyLoss"), UTILS: ("masked_mean",)}
ARGS = {"--algo.advantage.is_correction_level": "is_correction_level",
        "--algo.advantage.is_correction_mode": "is_correction_mode",
        "--algo.advantage.is_correction_gating": "is_correction_gating",
        "--algo.advantage.is_correction_threshold": "is_correction_threshold",
        "--actor.policy_loss_type": "policy_loss_type",
        "--train.micro_batch_size": "micro_train_batch_size"}
DTYPES = {"fp32": torch.float32, "fp64": torch.float64}
MICRO = "micro_train_batch_size"
KEYS = ("vllm_kl", "is_filter_ratio")


def _load(wheel: Path) -> tuple[dict, dict, dict]:
    """OpenRLHF's code, compiled unchanged from the wheel; its defaults; the provenance of each function."""
    namespace = {"torch": torch, "nn": nn, "F": F, "dist": dist, "Optional": typing.Optional,
                 "Tuple": tuple}
    provenance = {}
    with zipfile.ZipFile(wheel) as archive:
        sources = {name: archive.read(ROOT + name).decode() for name in (*FUNCTIONS, CLI)}
        meta = next(n for n in archive.namelist() if n.endswith(".dist-info/METADATA"))
        version = re.search(r"^Version: (.+)$", archive.read(meta).decode(), re.M)[1]
    for path in (UTILS, LOSS):
        names, source = FUNCTIONS[path], sources[path]
        for node in ast.parse(source).body:
            if isinstance(node, (ast.FunctionDef, ast.ClassDef)) and node.name in names:
                exec(compile(ast.Module(body=[node], type_ignores=[]), path, "exec"), namespace)
                segment = ast.get_source_segment(source, node)
                provenance[node.name] = {"file": path, "lines": [node.lineno, node.end_lineno],
                                         "sha256": hashlib.sha256(segment.encode()).hexdigest()}
        missing = [n for n in names if n not in namespace]
        if missing:
            raise SystemExit(f"{path} of the wheel lacks {missing}: OpenRLHF changed")
    defaults = {}
    for node in ast.walk(ast.parse(sources[CLI])):
        if isinstance(node, ast.Call) and getattr(node.func, "attr", "") == "add_argument" and node.args:
            flag = node.args[0]
            if isinstance(flag, ast.Constant) and flag.value in ARGS:
                default = next(k.value for k in node.keywords if k.arg == "default")
                defaults[ARGS[flag.value]] = ast.literal_eval(default)
    if len(defaults) != len(ARGS):
        raise SystemExit(f"{CLI} lacks {set(ARGS.values()) - set(defaults)}: OpenRLHF changed")
    return namespace, defaults, {"openrlhf_version": version, "functions": provenance,
                                 "wheel_sha256": hashlib.sha256(wheel.read_bytes()).hexdigest()}


def _all_reduce(value: float) -> float:
    """strategy.all_reduce of one Python float on one process: a float32 tensor, mean over 1 rank, .item()."""
    data = torch.Tensor([value])
    data /= 1
    return data.item()


def _outputs(openrlhf: dict, defaults: dict, settings: dict, old, rollout, mask, dtype) -> dict:
    values = {**defaults, **settings}
    size = values.pop(MICRO)
    threshold = list(values.pop("is_correction_threshold"))
    if len(threshold) == 1:  # train_ppo_ray.py __main__
        threshold.insert(0, 0.0)
    if len(threshold) != 2:
        return {"error": "AssertionError", "message": "--algo.advantage.is_correction_threshold takes HIGH or LOW HIGH"}
    try:
        loss_fn = openrlhf["PolicyLoss"](is_correction_threshold=threshold, **values)
    except (ValueError, AssertionError) as error:
        return {"error": type(error).__name__, "message": str(error)}
    old_t, rollout_t = torch.tensor(old, dtype=dtype), torch.tensor(rollout, dtype=dtype)
    mask_t = torch.tensor(mask) != 0
    status_list, per_micro_batch = [], {k: [] for k in KEYS}
    try:
        for start in range(0, len(old) - size + 1, size):  # DataLoader(drop_last=True)
            rows = slice(start, start + size)
            _, _, _, vllm_kl, is_filter_ratio = loss_fn(
                old_t[rows], old_t[rows], torch.zeros_like(old_t[rows]), action_mask=mask_t[rows],
                rollout_log_probs=rollout_t[rows])
            if vllm_kl is None:
                continue
            metrics = {"vllm_kl": vllm_kl.detach(), "is_filter_ratio": is_filter_ratio.detach()}
            n_tokens = float(mask_t[rows].sum().item())
            reduced = {k: _all_reduce(v.float().mean().item() * n_tokens) for k, v in metrics.items()}
            n = _all_reduce(n_tokens)
            merged = {k: v / n for k, v in reduced.items()}  # ZeroDivisionError for a micro-batch without a token
            merged["_num_action_tokens"] = n
            status_list.append(merged)
            for k in KEYS:
                per_micro_batch[k].append(float(metrics[k].float().item()))
    except ValueError as error:
        return {"error": type(error).__name__, "message": str(error)}
    except ZeroDivisionError as error:
        return {"metrics": {}, "raised": f"{type(error).__name__}: {error}",
                "micro_batches": {"train/" + k: _encode(v) for k, v in per_micro_batch.items() if v}}
    if not status_list:
        return {"metrics": {}}
    total = sum(s["_num_action_tokens"] for s in status_list)
    out = {k: sum(s[k] * s["_num_action_tokens"] for s in status_list) / total for k in KEYS}
    return {"metrics": {"train/" + k: _encode(float(v)) for k, v in sorted(out.items())},
            "micro_batches": {"train/" + k: _encode(v) for k, v in sorted(per_micro_batch.items())}}


def _base(seed: int = 29, lengths=(8, 6, 3, 1, 7, 5), width: int = 8, scale: float = 0.3):
    rng = np.random.default_rng(seed)
    mask = _mask(lengths, width)
    old = rng.uniform(-3.0, -0.05, size=(len(lengths), width))
    rollout = np.minimum(old - rng.normal(0.02, scale, size=old.shape), -0.01)
    keep = np.asarray(mask) == 1
    return _f32(np.where(keep, old, 0.0)), _f32(np.where(keep, rollout, 0.0)), mask  # zero padding


def _cases() -> list[dict]:
    cases = []

    def add(name, settings, inputs):
        old, rollout, mask = inputs
        cases.append({"name": name, "settings": settings, "old_log_prob": old, "rollout_log_prob": rollout,
                      "response_mask": mask})

    tis = {"is_correction_level": "token", "is_correction_mode": "clip"}
    icepop = {"is_correction_level": "token"}
    seq = {"is_correction_level": "seq"}
    named = {"tis": tis, "icepop": icepop, "seq_mask_tis": seq}
    base = _base()
    add("defaults_off", {}, base)
    for name, settings in named.items():
        add(f"{name}_default_band", settings, base)
        add(f"{name}_band_0_8_1_25", {**settings, "is_correction_threshold": [0.8, 1.25]}, base)
    add("icepop_upper_only", {**icepop, "is_correction_threshold": [1.2]}, base)
    add("seq_mask_tis_narrow_band", {**seq, "is_correction_threshold": [0.95, 1.05]}, base)
    for gating, delta in (("binary_kl", 0.002), ("tv", 0.05)):
        for level in ("token", "seq"):
            add(f"{gating}_{level}", {"is_correction_level": level, "is_correction_gating": gating,
                                      "is_correction_threshold": [delta]}, base)
    add("gspo_logs_nothing", {**icepop, "policy_loss_type": "gspo"}, base)
    for size in (2, 4, 6):  # 4: the short last micro-batch is dropped; 6: one micro-batch holds every row
        for name, settings in named.items():
            add(f"micro_batch_{size}_{name}", {**settings, "is_correction_threshold": [0.8, 1.25], MICRO: size},
                base)
    add("micro_batch_7_too_few_rows", {**icepop, MICRO: 7}, base)

    # An empty row among valid ones (its geometric mean is 0/0 = NaN: a dropped sequence); an empty micro-batch.
    old, rollout, _ = _base(seed=5)
    empty_row = (old, rollout, _mask((8, 5, 0, 2, 8, 1), 8))
    for name, settings in named.items():
        add(f"empty_row_{name}_micro_batch_3", {**settings, "is_correction_threshold": [0.8, 1.25], MICRO: 3},
            empty_row)
    add("empty_row_icepop_micro_batch_1", icepop, empty_row)
    add("empty_micro_batch_tis_micro_batch_2", {**tis, MICRO: 2}, (old, rollout, _mask((8, 5, 0, 0, 8, 1), 8)))

    # Rows of one token, one position wide.
    single = (_f32([[-1.0], [-0.5], [-2.0]]), _f32([[-1.2], [-0.5], [-1.0]]), [[1], [1], [1]])
    add("one_token_rows_icepop", icepop, single)
    add("one_token_rows_seq_micro_batch_3", {**seq, MICRO: 3}, single)

    # Catastrophic tokens: |d| = 25 (exp(25) overflows no float, but is far outside every band), and -inf.
    old, rollout, mask = _base(seed=7)
    rollout[0][2] = old[0][2] - 25.0
    rollout[1][1] = old[1][1] + 25.0
    catastrophic = ([r[:] for r in old], [r[:] for r in rollout], mask)
    rollout[2][0] = float("-inf")  # d = +inf: the KL is -inf, the ratio inf
    neg_inf = (old, rollout, mask)
    for name, settings in {**named, "tv_token": {"is_correction_level": "token", "is_correction_gating": "tv",
                                                 "is_correction_threshold": [0.05]}}.items():
        add(f"catastrophic_{name}", settings, catastrophic)
        add(f"neg_inf_rollout_{name}", settings, neg_inf)
        add(f"neg_inf_rollout_{name}_micro_batch_2", {**settings, MICRO: 2}, neg_inf)

    # Long rows: a sum of log-ratios far beyond float32's exp range, and a long row's geometric mean.
    width = 64
    long_rows = ([[-1.0] * width] * 4, [[-1.5] * width, [-0.5] * width, [-1.01] * width, [-1.0] * width],
                 _mask((64, 64, 64, 10), width))
    for name, settings in named.items():
        add(f"long_rows_{name}", settings, long_rows)

    # NaN log-probs on valid tokens: mask gates drop them, clip gates keep them; the KL is NaN.
    old, rollout, mask = _base(seed=11)
    rollout[0][3] = float("nan")
    old[4][1] = float("nan")
    nan_tokens = (old, rollout, mask)
    for name, settings in {**named, "binary_kl_seq": {"is_correction_level": "seq",
                                                      "is_correction_gating": "binary_kl",
                                                      "is_correction_threshold": [0.002]}}.items():
        add(f"nan_tokens_{name}", settings, nan_tokens)
        add(f"nan_tokens_{name}_micro_batch_2", {**settings, MICRO: 2}, nan_tokens)

    # Ratios exactly on a bound: the band is closed ([low, high] kept).
    on_bound = ([[-1.0, -2.0, -0.5], [-0.25, -1.5, 0.0]], [[-1.0, -2.0, -0.5], [-0.25, -1.5, 0.0]], _mask((3, 2), 3))
    for name, settings in named.items():
        add(f"on_bound_{name}", {**settings, "is_correction_threshold": [1.0, 1.0]}, on_bound)

    # Settings OpenRLHF refuses (PolicyLoss's constructor, train_ppo_ray.py's assert, forward's ValueError).
    add("ERR_unknown_level", {"is_correction_level": "sequence"}, base)
    add("ERR_unknown_mode", {"is_correction_level": "token", "is_correction_mode": "truncate"}, base)
    add("ERR_unknown_gating", {"is_correction_level": "token", "is_correction_gating": "kl"}, base)
    add("ERR_clip_at_seq_level", {"is_correction_level": "seq", "is_correction_mode": "clip"}, base)
    add("ERR_clip_with_divergence_even_when_off", {"is_correction_mode": "clip", "is_correction_gating": "tv"}, base)
    add("ERR_divergence_with_a_lower_bound", {"is_correction_level": "token", "is_correction_gating": "binary_kl"},
        base)
    add("ERR_three_thresholds", {"is_correction_level": "token", "is_correction_threshold": [0.5, 1.0, 2.0]}, base)
    add("ERR_unknown_policy_loss_type", {"is_correction_level": "token", "policy_loss_type": "grpo"}, base)
    return cases


def main(wheel: str, out: str) -> None:
    openrlhf, defaults, provenance = _load(Path(wheel))
    cases = _cases()
    for case in cases:
        inputs = (case["old_log_prob"], case["rollout_log_prob"], case["response_mask"])
        for label, dtype in DTYPES.items():
            case[label] = _outputs(openrlhf, defaults, case["settings"], *inputs, dtype)
        case["old_log_prob"] = _encode(case["old_log_prob"])
        case["rollout_log_prob"] = _encode(case["rollout_log_prob"])
    document = {
        **provenance,
        "torch_version": torch.__version__,
        "settings_source": f"{CLI} add_argument defaults ({', '.join(ARGS)}); {MICRO} is --train.micro_batch_size",
        "defaults": defaults,
        "cases": cases,
    }
    write_cases(document, out)
    print(f"{len(cases)} cases -> {out}")


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2] if len(sys.argv) > 2 else "tests/data/openrlhf_parity_cases.json")
