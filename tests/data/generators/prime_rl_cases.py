"""Parity cases for prime-rl's trainer-side mismatch metrics, produced by prime-rl's own code at a pinned commit.

Run by hand, never by CI or the tests, with the interpreter of a scratch venv:

    python3 -m venv SCRATCH/venv
    SCRATCH/venv/bin/pip install torch==2.13.0            # the CPU wheel
    SCRATCH/venv/bin/pip install prime-pydantic-config==0.4.3 jaxtyping beartype numpy
    SCRATCH/venv/bin/python tests/data/generators/prime_rl_cases.py MIRROR tests/data/prime_rl_parity_cases.json

MIRROR is a git directory of github.com/PrimeIntellect-ai/prime-rl holding commit COMMIT below. prime-rl's
modules import flash-attention, torchtitan, transformers and a GPU, so this script reads three files at that
commit with `git show` and takes from their syntax trees only what the metrics need, compiled unchanged under
their original file names:

- `src/prime_rl/trainer/rl/loss.py`: `LossInputs`, `LossOutputs`, `_safe_mean`,
  `compute_importance_ratio_and_mismatch_kl`, `default_loss_fn`, `ipo_loss_fn`, `ref_kl_loss_fn`, `ce_loss_fn`,
  `setup_rl_loss_fn` and `compute_loss` (jaxtyping's annotations are real; `import_object` is a stub that refuses);
- `packages/prime-rl-configs/src/prime_rl/configs/trainer.py`: `DefaultLossConfig`, `IPOLossConfig`,
  `CustomLossConfig` and the `LossConfig` union, on prime-pydantic-config's `BaseConfig` (extra fields forbidden):
  the settings are validated by pydantic against that union, so defaults and refusals are prime-rl's;
- `src/prime_rl/trainer/utils.py`: `flexible_all_gather`, `Tensors` (its `compute_stats`),
  `_is_env_tensor_stat` and `filter_rl_trainer_tensor_stats_for_wandb`, run on a one-process gloo group. The
  per-step tensors are moved `.to("cuda")` there; the tensors appended here are of a CPU subclass whose `to`
  ignores a device (the only change of place, no arithmetic).

What `src/prime_rl/trainer/rl/train.py` does inline around them (the training loop, not a function) is the glue
here, line for line: one micro batch holding every row as one sample (rl_weights, ce_weights and ref_kl_weights
None, so the mismatch mask is the loss mask), `compute_loss(...)` with the loss fn of `setup_rl_loss_fn`, each
returned loss tensor appended to `tensors[key]`, `compute_importance_ratio_and_mismatch_kl(trainer, inference)`
masked by the loss mask appended to `tensors["mismatch_kl/all"]`, then `tensors.compute_stats()` and
`filter_rl_trainer_tensor_stats_for_wandb`. Entropy, loss, the per-environment copies and `kl_ent_ratio/mean` are
left out: a dump has no logits, no environment names and no packing.

The trainer log-probs are the dump's `old_log_prob`, the inference log-probs its `rollout_log_prob`; the per-token
advantages (`advantages`, [B, T], same dtype) are inputs of each case.
"""

from __future__ import annotations

import ast
import collections
import datetime
import hashlib
import os
import subprocess
import sys
import tempfile
import types
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Annotated, Any, Literal, TypeAlias

import numpy as np
import pydantic
import torch
import torch.distributed as dist
from casefile import encode as _encode
from casefile import f32 as _f32
from casefile import mask as _mask
from casefile import write_cases
from jaxtyping import Bool, Float, Int
from pydantic import Field, ValidationError
from pydantic_config import BaseConfig
from torch import Tensor

COMMIT = "559b44772e471d1538537b8805cc77f3824a5e64"
LOSS_FILE = "src/prime_rl/trainer/rl/loss.py"
CONFIG_FILE = "packages/prime-rl-configs/src/prime_rl/configs/trainer.py"
UTILS_FILE = "src/prime_rl/trainer/utils.py"
LOSS_NAMES = ("LossInputs", "LossOutputs", "LossFn", "_safe_mean", "compute_importance_ratio_and_mismatch_kl",
              "default_loss_fn", "ipo_loss_fn", "ref_kl_loss_fn", "ce_loss_fn", "setup_rl_loss_fn", "compute_loss")
CONFIG_NAMES = ("DefaultLossConfig", "IPOLossConfig", "CustomLossConfig", "LossConfig")
UTILS_NAMES = ("flexible_all_gather", "Tensors", "_is_env_tensor_stat", "filter_rl_trainer_tensor_stats_for_wandb")
DTYPES = {"fp32": torch.float32, "fp64": torch.float64}


def _show(mirror: str, path: str) -> str:
    return subprocess.run(["git", "-C", mirror, "show", f"{COMMIT}:{path}"], check=True, capture_output=True,
                          text=True).stdout


def _take(source: str, path: str, names: tuple[str, ...], namespace: dict) -> list[dict]:
    """Compile the named top-level definitions of `source` unchanged (original file name, line numbers) into
    `namespace`, in file order; return their provenance (lines and sha256 of each definition's source)."""
    tree = ast.parse(source)
    found, provenance = [], []
    for node in tree.body:
        name = getattr(node, "name", None)
        if isinstance(node, ast.Assign) and isinstance(node.targets[0], ast.Name):
            name = node.targets[0].id
        if isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name):
            name = node.target.id
        if name in names:
            found.append(name)
            segment = ast.get_source_segment(source, node)
            if getattr(node, "decorator_list", None):
                start = node.decorator_list[0].lineno
                segment = "\n".join(source.splitlines()[start - 1:node.end_lineno])
            exec(compile(ast.Module(body=[node], type_ignores=[]), path, "exec"), namespace)
            provenance.append({"name": name, "lines": [node.lineno, node.end_lineno],
                               "sha256": hashlib.sha256(segment.encode()).hexdigest()})
    missing = set(names) - set(found)
    if missing:
        raise SystemExit(f"{path} at {COMMIT} lacks {sorted(missing)}: prime-rl changed")
    return provenance


def _import_object(path: str):
    raise SystemExit(f"custom loss {path!r}: not replayed")


def _load(mirror: str) -> tuple[dict, list[dict]]:
    module = types.ModuleType("prime_rl_replay")  # dataclass and pydantic look their module up
    sys.modules[module.__name__] = module
    namespace: dict[str, Any] = module.__dict__
    namespace.update({
        "torch": torch, "Tensor": Tensor, "dist": dist, "dataclass": dataclass,
        "field": field, "Any": Any, "Callable": Callable, "Float": Float, "Bool": Bool, "Int": Int,
        "Annotated": Annotated, "Literal": Literal, "TypeAlias": TypeAlias, "Field": Field, "BaseConfig": BaseConfig,
        "import_object": _import_object, "defaultdict": collections.defaultdict,
    })
    provenance = []
    for path, names in ((CONFIG_FILE, CONFIG_NAMES), (LOSS_FILE, LOSS_NAMES), (UTILS_FILE, UTILS_NAMES)):
        functions = _take(_show(mirror, path), path, names, namespace)
        provenance.append({"file": path, "definitions": functions})
    return namespace, provenance


class _Host(torch.Tensor):
    """A CPU tensor whose `.to(device)` stays put: `Tensors.compute_stats` moves its tensors to "cuda"."""

    def to(self, *args, **kwargs):  # noqa: D102
        if args and isinstance(args[0], (str, torch.device)):
            args = args[1:]
        kwargs.pop("device", None)
        return super().to(*args, **kwargs) if args or kwargs else self


def _settings(ns: dict, settings: dict):
    """The `[loss]` table as `TrainerConfig.loss` validates it: a field `loss: LossConfig = DefaultLossConfig()` on
    prime-pydantic-config's `BaseConfig`, which fills in the default's `type` tag when the table has none."""
    holder = ns.get("_LossHolder")
    if holder is None:
        holder = pydantic.create_model("_LossHolder", __base__=BaseConfig,
                                       loss=(ns["LossConfig"], ns["DefaultLossConfig"]()))
        ns["_LossHolder"] = holder
    return holder.model_validate({"loss": dict(settings)}).loss


def _step(ns: dict, config, old, rollout, advantages, mask) -> dict[str, float]:
    """One training step of prime-rl over every row (train.py's glue around the upstream functions)."""
    tensors = ns["Tensors"]()
    rl_loss_fn = ns["setup_rl_loss_fn"](config)
    rows = range(old.shape[0])
    loss, loss_tensors = ns["compute_loss"](
        trainer_logprobs=[old[i] for i in rows], inference_logprobs=[rollout[i] for i in rows], ref_logprobs=None,
        advantages=[advantages[i] for i in rows], loss_mask=[mask[i] for i in rows], rl_weights=None,
        ce_weights=None, ref_kl_weights=None, rl_loss_fn=rl_loss_fn, rl_scale=max(int(mask.sum()), 1), ce_scale=1,
        ref_kl_scale=1)
    # train.py: rl_weights and ref_kl_weights are None, so mismatch_mask = loss_mask and has_mismatch_tokens.
    with torch.no_grad():
        _, _, mismatch_kl = ns["compute_importance_ratio_and_mismatch_kl"](old, rollout)
    tensors["mismatch_kl/all"].append(mismatch_kl[mask].detach().as_subclass(_Host))
    for key, loss_tensor in loss_tensors.items():
        tensors[key].append(loss_tensor.detach().as_subclass(_Host))
    stats = ns["filter_rl_trainer_tensor_stats_for_wandb"](ns["Tensors"].compute_stats(tensors))
    stats.pop("step", None)
    return {k: float(v) for k, v in sorted(stats.items())}


def _outputs(ns: dict, case: dict, dtype) -> dict:
    try:
        config = _settings(ns, case["settings"])
    except ValidationError as error:
        first = error.errors()[0]
        return {"error": "ValidationError", "loc": [str(p) for p in first["loc"]], "message": first["msg"]}
    old = torch.tensor(case["old_log_prob"], dtype=dtype)
    rollout = torch.tensor(case["rollout_log_prob"], dtype=dtype)
    advantages = torch.tensor(case["advantages"], dtype=dtype)
    mask = torch.tensor(case["response_mask"], dtype=torch.bool)
    metrics = _step(ns, config, old, rollout, advantages, mask)
    return {"metrics": {k: _encode(v) for k, v in metrics.items()}}


def _base(seed: int = 2478, lengths=(10, 7, 4, 1, 9), width: int = 10, scale: float = 0.5, high: float = -0.02):
    """Log-probs near 0 (probabilities up to ~1) so that prime-rl's probability difference crosses 0.2 often."""
    rng = np.random.default_rng(seed)
    mask = _mask(lengths, width)
    old = rng.uniform(-2.5, high, size=(len(lengths), width))
    rollout = np.minimum(old - rng.normal(0.0, scale, size=old.shape), -0.005)
    rollout = np.where(np.asarray(mask) == 1, rollout, 0.0)
    return _f32(old), _f32(rollout), mask


def _row_advantages(values, width) -> list:
    """GRPO-style: one advantage per row, broadcast to its tokens."""
    return _f32([[v] * width for v in values])


def _cases() -> list[dict]:
    cases = []

    def add(name, settings, inputs, advantages):
        old, rollout, mask = inputs
        cases.append({"name": name, "settings": settings, "old_log_prob": old, "rollout_log_prob": rollout,
                      "advantages": advantages, "response_mask": mask})

    base = _base()
    row_adv = _row_advantages((0.8, -0.6, 0.0, 1.2, -0.3), 10)
    rng = np.random.default_rng(21)
    token_adv = _f32(rng.normal(0.0, 1.0, size=(5, 10)) * (rng.uniform(size=(5, 10)) > 0.15))
    add("defaults", {}, base, row_adv)
    add("defaults_type_given", {"type": "default"}, base, row_adv)
    add("token_advantages", {}, base, token_adv)
    add("asymmetric_band", {"dppo_mask_low": 0.1, "dppo_mask_high": 0.35}, base, token_adv)
    add("zero_thresholds", {"dppo_mask_low": 0.0, "dppo_mask_high": 0.0}, base, token_adv)
    add("wide_thresholds", {"dppo_mask_low": 1.0, "dppo_mask_high": 1.0}, base, row_adv)
    add("taus_do_not_change_metrics", {"adv_tau": 0.5, "kl_tau": 0.1}, base, row_adv)
    add("all_positive_advantages", {}, base, _row_advantages((1.0,) * 5, 10))
    add("all_zero_advantages", {}, base, _row_advantages((0.0,) * 5, 10))
    add("ipo_defaults", {"type": "ipo"}, base, row_adv)
    add("ipo_threshold", {"type": "ipo", "ipo_threshold": 0.25}, base, token_adv)
    add("ipo_zero_threshold", {"type": "ipo", "ipo_threshold": 0.0}, base, row_adv)

    # Larger probability moves: log-probs near 0 on one side.
    wide = _base(seed=7, scale=1.2, high=-0.001)
    add("large_moves_defaults", {}, wide, token_adv)
    add("large_moves_ipo", {"type": "ipo"}, wide, token_adv)

    # An empty row among valid ones; then a batch with no token at all.
    old, rollout, _ = _base(seed=5)
    empty_row = (old, [r if i != 2 else [0.0] * 10 for i, r in enumerate(rollout)], _mask((10, 5, 0, 2, 6), 10))
    all_empty = (old, [[0.0] * 10 for _ in old], _mask((0, 0, 0, 0, 0), 10))
    add("empty_row_defaults", {}, empty_row, token_adv)
    add("empty_row_ipo", {"type": "ipo"}, empty_row, token_adv)
    add("all_empty_defaults", {}, all_empty, token_adv)
    add("all_empty_ipo", {"type": "ipo"}, all_empty, token_adv)

    # A batch of one row with one token: the unbiased std of one value is NaN.
    one = ([[-0.4, -1.0, -2.0]], [[-0.9, 0.0, 0.0]], _mask((1,), 3))
    add("one_token_defaults", {}, one, [[0.5, 0.5, 0.5]])
    add("one_token_ipo", {"type": "ipo"}, one, [[0.5, 0.5, 0.5]])

    # Catastrophic tokens: |d| = 25 both ways, and a rollout log-prob of -inf (d = +inf: exp(d) - d = NaN).
    old, rollout, mask = _base(seed=11)
    rollout[0][2] = old[0][2] - 25.0
    rollout[1][1] = old[1][1] + 25.0
    catastrophic = (old, rollout, mask)
    add("catastrophic_defaults", {}, catastrophic, token_adv)
    add("catastrophic_ipo", {"type": "ipo"}, catastrophic, token_adv)
    old, rollout, mask = _base(seed=12)
    rollout[2][0] = float("-inf")
    add("rollout_minus_inf_defaults", {}, (old, rollout, mask), token_adv)
    old, rollout, mask = _base(seed=13)
    old[1][3] = float("-inf")  # d = -inf: mismatch_kl = 0 + inf - 1 = inf
    add("trainer_minus_inf_ipo", {"type": "ipo"}, (old, rollout, mask), token_adv)

    # exp(d) overflow: d = 100 overflows float32 only, d = 800 float64 too.
    width = 6
    overflow = ([[-1.0] * width, [-1.0] * width, [-1.0] * width],
                [[-101.0] + [-1.1] * (width - 1), [-1.2] * width, [-801.0] + [-1.0] * (width - 1)],
                _mask((6, 6, 3), width))
    narrow = [row[:width] for row in token_adv[:3]]
    add("overflow_f32_only", {}, (overflow[0][:2], overflow[1][:2], overflow[2][:2]), narrow[:2])
    add("overflow_both", {}, overflow, narrow)
    add("overflow_ipo", {"type": "ipo"}, overflow, narrow)

    # Tokens the inference engine could not score (NaN), and non-finite values in the padding.
    old, rollout, mask = _base(seed=17)
    rollout[0][3], rollout[1][0] = float("nan"), float("nan")
    old[2][5], rollout[2][6], rollout[3][4] = float("nan"), float("inf"), float("-inf")  # all in padding
    add("nan_and_padding_defaults", {}, (old, rollout, mask), token_adv)
    add("nan_and_padding_ipo", {"type": "ipo"}, (old, rollout, mask), token_adv)

    # Sentinel fills (-9999) on a masked token: probability 0.
    old, rollout, mask = _base(seed=19)
    rollout[1][2] = -9999.0
    add("sentinel_defaults", {}, (old, rollout, mask), token_adv)

    # A long batch: per-sample means of many tokens.
    rng = np.random.default_rng(478)
    old = rng.uniform(-1.5, -0.01, size=(4, 128))
    rollout = np.minimum(old - rng.normal(0.0, 0.3, size=old.shape), -0.001)
    long = (_f32(old), _f32(rollout), _mask((128, 64, 16, 100), 128))
    add("long_rows_defaults", {}, long, _row_advantages((0.5, -0.5, 1.5, -1.0), 128))

    # Settings prime-rl refuses (pydantic, before training starts).
    add("ERR_negative_mask_low", {"dppo_mask_low": -0.1}, base, row_adv)
    add("ERR_negative_ipo_threshold", {"type": "ipo", "ipo_threshold": -1.0}, base, row_adv)
    add("ERR_ipo_field_on_default", {"ipo_threshold": 0.3}, base, row_adv)
    add("ERR_dppo_field_on_ipo", {"type": "ipo", "dppo_mask_high": 0.3}, base, row_adv)
    add("ERR_unknown_type", {"type": "dppo"}, base, row_adv)
    add("ERR_mask_not_a_number", {"dppo_mask_high": "wide"}, base, row_adv)
    return cases


def main(mirror: str, out: str) -> None:
    os.environ.setdefault("MASTER_ADDR", "127.0.0.1")
    os.environ.setdefault("MASTER_PORT", "29531")
    with tempfile.TemporaryDirectory() as scratch:
        dist.init_process_group("gloo", init_method=f"file://{scratch}/store", rank=0, world_size=1)
        ns, provenance = _load(mirror)
        cases = _cases()
        for case in cases:
            for label, dtype in DTYPES.items():
                case[label] = _outputs(ns, case, dtype)
            try:
                case["resolved"] = _settings(ns, case["settings"]).model_dump()
            except ValidationError:
                case["resolved"] = None
            for key in ("old_log_prob", "rollout_log_prob", "advantages"):
                case[key] = _encode(case[key])
        dist.destroy_process_group()
    document = {
        "prime_rl_commit": COMMIT,
        "torch_version": torch.__version__,
        "pydantic_version": pydantic.VERSION,
        "generated": datetime.date.today().isoformat(),
        "source": provenance,
        "defaults": {"default": _settings(ns, {}).model_dump(), "ipo": _settings(ns, {"type": "ipo"}).model_dump()},
        "cases": cases,
    }
    write_cases(document, out)
    print(f"{len(cases)} cases -> {out}")


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2] if len(sys.argv) > 2 else "tests/data/prime_rl_parity_cases.json")
