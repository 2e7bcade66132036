"""Parity cases for AReaL's decoupled-PPO rejection sampling, produced by AReaL's own code.

Run by hand, never by CI or the tests. AReaL 1.0.4's modules import aiohttp, ray, the inference engines and
more, so the definitions are read straight out of the wheel:

    python3 -m venv SCRATCH/venv && SCRATCH/venv/bin/pip install torch==2.13.0 numpy   # the CPU wheel
    pip download areal==1.0.4 --no-deps -d SCRATCH
    SCRATCH/venv/bin/python tests/data/generators/areal_cases.py SCRATCH/areal-1.0.4-py3-none-any.whl \
        tests/data/areal_parity_cases.json

The script parses seven files of the wheel with `ast`, takes the named definitions unchanged, compiles them under
their original file names and executes them in one namespace holding torch, numpy and the standard-library names
they use (a no-op logger, `current_platform` as not initialized: one CPU process). Nothing of AReaL's arithmetic is
re-written here:

- areal/trainer/ppo/actor.py: `grpo_loss_fn` (the actor's loss function: it resolves the proximal log-probs,
  calls `ppo_actor_loss_fn` and logs the keys) and the helpers it calls;
- areal/utils/functional/functional.py: `ppo_actor_loss_fn`, `apply_rejection_sampling`, `_check_bounds`;
- areal/utils/data.py: `KLEstimator`; areal/api/cli_args.py: `RejectionSamplingConfig` (its `__post_init__`
  refuses settings); areal/utils/stats_tracker.py: `DistributedStatsTracker`, whose `export` gives the keys;
- areal/utils/constants.py and areal/trainer/ppo/stats.py: `ProxLogpMethod`, `infer_token_denominator`.

One `grpo_loss_fn` call per case = the whole case as one micro-batch, inside the tracker scopes `ppo_actor` /
`update` that `PPOActor.ppo_update` opens; the keys are the tracker's export. Inputs: AReaL's behaviour log-probs
(`logprobs`, from the inference engine) are the dump's rollout side; its proximal log-probs (`prox_logp`,
recomputed by the trainer) are the dump's old side when `use_decoupled_loss` is true; when it is false AReaL's
`compute_advantages` sets `prox_logp` to the inference log-probs themselves (recompute_logprob=False, the default).
The current policy's log-probs equal the proximal ones (the first micro-batch of a step), advantages are 1,
entropy 0: the keys recorded here do not read them. Only the keys the dump determines are kept (`behave_*`,
`unclipped_behave_tokens`, `rs_filtered_fraction`). The tracker refuses any tensor but float32; for the fp64 run
its module sees a `torch` whose `float` compares equal to float32 and float64 (nothing else changes), so
AReaL's code runs unchanged in float64.
"""

from __future__ import annotations

import ast
import dataclasses
import functools
import hashlib
import math
import re
import sys
import time
import types
import typing
import warnings
import zipfile
from collections import defaultdict
from contextlib import contextmanager
from enum import Enum, auto
from pathlib import Path
from threading import Lock

import numpy as np
import torch
import torch.distributed as dist
from casefile import encode as _encode
from casefile import f32 as _f32
from casefile import mask as _mask
from casefile import write_cases

ACTOR = "areal/trainer/ppo/actor.py"
FUNCTIONAL = "areal/utils/functional/functional.py"
DATA = "areal/utils/data.py"
CLI_ARGS = "areal/api/cli_args.py"
TRACKER = "areal/utils/stats_tracker.py"
CONSTANTS = "areal/utils/constants.py"
STATS = "areal/trainer/ppo/stats.py"
NAMES = {
    CONSTANTS: ("ProxLogpMethod", "ProxApproxMethod", "PROX_LOGP_METHOD_RECOMPUTE", "PROX_LOGP_METHOD_LOGLINEAR",
                "PROX_LOGP_METHOD_METRICS", "PROX_LOGP_METHODS_ALL", "PROX_APPROX_METHOD_LOGLINEAR",
                "PROX_APPROX_METHOD_LINEAR", "PROX_APPROX_METHOD_ROLLOUT", "PROX_APPROX_METHODS_ALL"),
    CLI_ARGS: ("RejectionSamplingConfig",),
    DATA: ("KLEstimator",),
    FUNCTIONAL: ("_compute_sequence_level_ratio_and_advantages", "RejectionSamplingResult", "_check_bounds",
                 "apply_rejection_sampling", "ppo_actor_loss_fn"),
    TRACKER: ("ReduceType", "MOE_AUX_LOSSES", "DistributedStatsTracker"),
    STATS: ("infer_token_denominator",),
    ACTOR: ("grpo_loss_fn", "compute_prox_logp_approximations", "_resolve_proximal_logp", "_apply_m2po_masking",
            "_get_m2po_loss_mask", "_EPSILON", "_compute_importance_weight", "_compute_approximation_errors",
            "_tensor_scalar_stats", "_log_approximation_metrics_for_method", "_log_proximal_approximation_stats",
            "_log_version_staleness_stats"),
}
REQUIRED = {"RejectionSamplingConfig", "KLEstimator", "apply_rejection_sampling", "ppo_actor_loss_fn",
            "DistributedStatsTracker", "grpo_loss_fn", "_resolve_proximal_logp", "infer_token_denominator"}
PREFIX = "ppo_actor/update/"
KEPT = ("behave_imp_weight/", "behave_approx_kl/", "unclipped_behave_tokens", "rs_filtered_fraction")
DTYPES = {"fp32": torch.float32, "fp64": torch.float64}
RS_FIELDS = ("level", "action", "metric", "agg", "upper", "lower")


class _Logger:
    def __getattr__(self, name):
        return lambda *args, **kwargs: None


class _Float:
    """`torch.float` for the tracker's dtype check in the fp64 run: equal to float32 and float64."""

    def __eq__(self, other):
        return other in (torch.float32, torch.float64)

    def __ne__(self, other):
        return not self.__eq__(other)

    __hash__ = object.__hash__


def _assigned(node) -> list[str]:
    if isinstance(node, ast.Assign):
        return [t.id for t in node.targets if isinstance(t, ast.Name)]
    if isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name):
        return [node.target.id]
    return []


def _load(wheel: Path) -> tuple[dict, dict, dict]:
    """AReaL's definitions compiled unchanged from the wheel, one shared namespace; defaults; provenance."""
    module = types.ModuleType("areal_upstream")  # dataclasses look their module up in sys.modules
    sys.modules[module.__name__] = module
    ns = module.__dict__
    ns.update({"torch": torch, "dist": dist, "np": np, "functools": functools, "math": math, "time": time,
          "warnings": warnings, "dataclass": dataclasses.dataclass, "field": dataclasses.field,
          "Any": typing.Any, "Enum": Enum, "auto": auto, "defaultdict": defaultdict, "Lock": Lock,
          "contextmanager": contextmanager, "logger": _Logger(), "logging": types.SimpleNamespace(
              getLogger=lambda *a, **k: _Logger()),
          "current_platform": types.SimpleNamespace(is_initialized=lambda: False, device_type="cpu"),
          "flat2d": lambda xs: [x for sub in xs for x in sub]})
    tracker_module = types.ModuleType("areal_stats_tracker")  # its own globals: the fp64 run swaps its `torch`
    tracker_module.__dict__.update({k: v for k, v in ns.items() if not k.startswith("__")})
    ns["tracker_globals"] = tracker_module.__dict__
    provenance = {}
    with zipfile.ZipFile(wheel) as archive:
        sources = {name: archive.read(name).decode() for name in NAMES}
        meta = next(n for n in archive.namelist() if n.endswith(".dist-info/METADATA"))
        version = re.search(r"^Version: (.+)$", archive.read(meta).decode(), re.M)[1]
    for path, names in NAMES.items():
        source = sources[path]
        for node in ast.parse(source).body:
            name = getattr(node, "name", None)
            if name not in names and not set(_assigned(node)) & set(names):
                continue
            target = tracker_module.__dict__ if path == TRACKER else ns
            exec(compile(ast.Module(body=[node], type_ignores=[]), path, "exec"), target)
            if name:
                segment = ast.get_source_segment(source, node)
                provenance[name] = {"file": path, "lines": [node.lineno, node.end_lineno],
                                    "sha256": hashlib.sha256(segment.encode()).hexdigest()}
    ns["DistributedStatsTracker"] = tracker_module.__dict__.get("DistributedStatsTracker")
    missing = sorted(REQUIRED - {k for k, v in ns.items() if v is not None})
    if missing:
        raise SystemExit(f"the wheel lacks {missing}: AReaL changed")
    defaults = {"use_decoupled_loss": None, "rejection_sampling": None}
    for node in ast.parse(sources[CLI_ARGS]).body:
        if isinstance(node, ast.ClassDef) and node.name in ("PPOActorConfig", "RejectionSamplingConfig"):
            for item in node.body:
                if not (isinstance(item, ast.AnnAssign) and isinstance(item.target, ast.Name)):
                    continue
                if node.name == "PPOActorConfig" and item.target.id not in defaults:
                    continue
                call = item.value
                value = next(k.value for k in call.keywords if k.arg == "default")
                defaults[item.target.id] = ast.literal_eval(value)
    return ns, defaults, {"areal_version": version, "functions": provenance,
                          "wheel_sha256": hashlib.sha256(wheel.read_bytes()).hexdigest()}


def _outputs(ns: dict, defaults: dict, settings: dict, old, rollout, mask, dtype) -> dict:
    values = {**defaults, **settings}
    sub = {k: values[k] for k in RS_FIELDS if k in settings}
    try:
        rs = ns["RejectionSamplingConfig"](**sub) if values["rejection_sampling"] or sub else None
    except ValueError as error:
        return {"error": type(error).__name__, "message": str(error)}
    behave = torch.tensor(rollout, dtype=dtype)
    prox = torch.tensor(old, dtype=dtype) if values["use_decoupled_loss"] else behave.clone()
    loss_mask = torch.tensor(mask, dtype=torch.bool)
    tracker = ns["DistributedStatsTracker"]()
    module = types.SimpleNamespace(stat=tracker.stat, denominator=tracker.denominator, scalar=tracker.scalar,
                                   scope=tracker.scope)
    ns["stats_tracker"] = module
    tracker_torch = torch
    if dtype != torch.float32:
        tracker_torch = types.SimpleNamespace(**{k: getattr(torch, k) for k in dir(torch) if not k.startswith("__")})
        tracker_torch.float = _Float()
    stat_globals = ns["tracker_globals"]
    saved = stat_globals["torch"]
    stat_globals["torch"] = tracker_torch
    input_data = {"logprobs": behave, "advantages": torch.ones_like(behave), "loss_mask": loss_mask,
                  "prox_logp": prox, "attention_mask": torch.ones_like(loss_mask)}
    try:
        with tracker.scope("ppo_actor"), tracker.scope("update"):
            ns["grpo_loss_fn"](prox.clone(), torch.zeros_like(behave), input_data, eps_clip=0.2,
                               eps_clip_higher=None, c_clip=None, rejection_sampling=rs)
        exported = tracker.export()
    except (RuntimeError, ValueError) as error:
        return {"error": type(error).__name__, "message": str(error)}
    finally:
        stat_globals["torch"] = saved
    metrics = {k: _encode(float(v)) for k, v in sorted(exported.items())
               if k.startswith(PREFIX) and k[len(PREFIX):].startswith(KEPT) and not k.endswith("__count")}
    return {"metrics": metrics}


def _base(seed: int = 31, lengths=(8, 6, 3, 1, 7, 5), width: int = 8, scale: float = 0.4):
    rng = np.random.default_rng(seed)
    mask = _mask(lengths, width)
    old = rng.uniform(-3.0, -0.05, size=(len(lengths), width))
    rollout = np.minimum(old - rng.normal(0.02, scale, size=old.shape), -0.01)
    m = np.asarray(mask) == 1
    return _f32(np.where(m, old, 0.0)), _f32(np.where(m, rollout, 0.0)), mask


def _cases() -> list[dict]:
    cases = []

    def add(name, settings, inputs):
        old, rollout, mask = inputs
        cases.append({"name": name, "settings": settings, "old_log_prob": old, "rollout_log_prob": rollout,
                      "response_mask": mask})

    on = {"use_decoupled_loss": True}
    rs = {**on, "rejection_sampling": True}
    base = _base()
    add("defaults_off", {}, base)
    add("decoupled_without_rejection_sampling", on, base)
    add("rejection_sampling_without_decoupled_loss", {"rejection_sampling": True}, base)
    add("token_mask_ratio_defaults", rs, base)
    add("token_mask_ratio_upper_1_3", {**on, "upper": 1.3}, base)
    add("token_mask_ratio_band", {**on, "upper": 1.3, "lower": 0.8}, base)
    add("token_clamp_ratio", {**on, "action": "clamp", "upper": 1.3}, base)
    add("token_clamp_ratio_band", {**on, "action": "clamp", "upper": 1.3, "lower": 0.8}, base)
    for metric, upper, lower in (("kl_k1", 0.2, -0.2), ("kl_k2", 0.05, None), ("kl_k3", 0.05, None),
                                 ("kl_k3", 0.05, 0.001), ("kl_k1", -0.1, None)):
        add(f"token_mask_{metric}_{upper}_{lower}", {**on, "metric": metric, "upper": upper, "lower": lower}, base)
    for agg in ("mean", "sum", "max"):
        add(f"sequence_mask_ratio_{agg}", {**on, "level": "sequence", "agg": agg, "upper": 1.2, "lower": 0.8},
            base)
        add(f"sequence_clamp_ratio_{agg}", {**on, "level": "sequence", "action": "clamp", "agg": agg,
                                            "upper": 1.2, "lower": 0.8}, base)
        add(f"sequence_mask_kl_k3_{agg}", {**on, "level": "sequence", "metric": "kl_k3", "agg": agg,
                                           "upper": 0.1}, base)
        add(f"sequence_mask_kl_k1_{agg}", {**on, "level": "sequence", "metric": "kl_k1", "agg": agg,
                                           "upper": 0.1, "lower": -0.1}, base)
    add("sequence_mask_kl_k2_mean", {**on, "level": "sequence", "metric": "kl_k2", "upper": 0.02}, base)
    add("token_level_agg_ignored", {**on, "agg": "max", "upper": 1.3}, base)

    # An empty row among valid ones; then a batch with no valid token at all.
    old, rollout, _ = _base(seed=5)
    empty_row = (old, rollout, _mask((8, 5, 0, 2, 8, 1), 8))
    all_empty = (old, rollout, _mask((0,) * 6, 8))
    for name, settings in (("token_mask", {**on, "upper": 1.3}),
                           ("sequence_mask_max", {**on, "level": "sequence", "agg": "max", "upper": 1.2}),
                           ("sequence_clamp", {**on, "level": "sequence", "action": "clamp", "upper": 1.2}),
                           ("sequence_kl_k3", {**on, "level": "sequence", "metric": "kl_k3", "upper": 0.05})):
        add(f"empty_row_{name}", settings, empty_row)
        add(f"all_empty_{name}", settings, all_empty)

    single = (_f32([[-1.0], [-0.5], [-2.0]]), _f32([[-1.2], [-0.5], [-1.0]]), [[1], [1], [1]])
    add("one_token_rows_token_mask", {**on, "upper": 1.3}, single)
    add("one_token_rows_sequence_mask", {**on, "level": "sequence", "upper": 1.2, "lower": 0.9}, single)

    # Catastrophic tokens: |d| = 25 and 100 (exp(100) overflows float32: the weight is inf).
    old, rollout, mask = _base(seed=7)
    rollout[0][2] = old[0][2] - 25.0
    rollout[1][1] = old[1][1] + 25.0
    catastrophic = ([r[:] for r in old], [r[:] for r in rollout], mask)
    rollout[4][3] = old[4][3] - 100.0
    overflow = (old, rollout, mask)
    for name, settings in (("token_mask", {**on, "upper": 2.0}),
                           ("token_clamp", {**on, "action": "clamp", "upper": 2.0}),
                           ("token_kl_k3", {**on, "metric": "kl_k3", "upper": 1.0}),
                           ("sequence_mask_mean", {**on, "level": "sequence", "upper": 2.0}),
                           ("sequence_clamp_sum", {**on, "level": "sequence", "action": "clamp", "agg": "sum",
                                                   "upper": 2.0})):
        add(f"catastrophic_{name}", settings, catastrophic)
        add(f"overflow_{name}", settings, overflow)
    add("overflow_token_kl_k1_kept", {**on, "metric": "kl_k1", "upper": 1000.0}, overflow)
    add("overflow_sequence_mask_sum_wide", {**on, "level": "sequence", "agg": "sum", "upper": 1e30}, overflow)

    # Long rows: a sequence sum of log-ratios of 32 (e^32 fits float32, the bounds are wide).
    width = 64
    long_rows = ([[-1.0] * width] * 4, [[-1.5] * width, [-2.5] * width, [-1.01] * width, [-1.0] * width],
                 _mask((64, 64, 64, 10), width))
    for agg in ("sum", "mean", "max"):
        add(f"long_rows_sequence_mask_{agg}", {**on, "level": "sequence", "agg": agg, "upper": 1e40}, long_rows)
        add(f"long_rows_sequence_clamp_{agg}", {**on, "level": "sequence", "action": "clamp", "agg": agg,
                                                "upper": 1e30}, long_rows)

    # Non-finite rollout log-probs on valid tokens (AReaL zeroes a non-finite log-ratio for the weight, the KL
    # metrics read the raw values), and in the padding; a non-finite proximal log-prob stops the step.
    old, rollout, mask = _base(seed=11)
    rollout[0][3], rollout[1][2] = float("nan"), float("-inf")
    nan_tokens = ([r[:] for r in old], [r[:] for r in rollout], mask)
    rollout[3][4], rollout[5][6] = float("inf"), float("nan")  # in the padding
    nan_padding = ([r[:] for r in old], rollout, mask)
    old[2][1] = float("-inf")
    bad_prox = (old, [r[:] for r in nan_tokens[1]], mask)
    for name, settings in (("token_mask", {**on, "upper": 1.3}),
                           ("token_clamp", {**on, "action": "clamp", "upper": 1.3}),
                           ("token_kl_k1", {**on, "metric": "kl_k1", "upper": 0.3, "lower": -0.3}),
                           ("sequence_mask_mean", {**on, "level": "sequence", "upper": 1.3}),
                           ("sequence_kl_k2_max", {**on, "level": "sequence", "metric": "kl_k2", "agg": "max",
                                                   "upper": 0.1})):
        add(f"nan_tokens_{name}", settings, nan_tokens)
        add(f"nan_padding_{name}", settings, nan_padding)
    add("nonfinite_proximal_stops", {**on, "upper": 1.3}, bad_prox)
    add("nonfinite_rollout_stops_without_decoupled_loss", {"upper": 1.3}, nan_tokens)

    # Values exactly on a bound are kept (<= upper, >= lower).
    on_bound = ([[-1.0, -2.0, -0.5], [-0.25, -1.5, -3.0]], [[-1.0, -2.0, -0.5], [-0.25, -1.5, -3.0]],
                _mask((3, 2), 3))
    add("on_bound_token_mask", {**on, "upper": 1.0000001, "lower": 1.0}, on_bound)
    add("on_bound_kl_k1", {**on, "metric": "kl_k1", "upper": 0.0, "lower": 0.0}, on_bound)

    # Settings AReaL refuses (RejectionSamplingConfig.__post_init__).
    add("ERR_unknown_level", {**on, "level": "row"}, base)
    add("ERR_unknown_action", {**on, "action": "truncate"}, base)
    add("ERR_unknown_metric", {**on, "metric": "k3"}, base)
    add("ERR_unknown_agg", {**on, "level": "sequence", "agg": "min"}, base)
    add("ERR_lower_above_upper", {**on, "upper": 2.0, "lower": 3.0}, base)
    add("ERR_ratio_upper_not_above_1", {**on, "upper": 1.0}, base)
    add("ERR_ratio_lower_not_positive", {**on, "upper": 2.0, "lower": 0.0}, base)
    add("ERR_kl_upper_not_positive", {**on, "metric": "kl_k3", "upper": 0.0}, base)
    add("ERR_clamp_with_kl", {**on, "action": "clamp", "metric": "kl_k2", "upper": 0.5}, base)
    return cases


def main(wheel: str, out: str) -> None:
    ns, defaults, provenance = _load(Path(wheel))
    cases = _cases()
    for case in cases:
        inputs = (case["old_log_prob"], case["rollout_log_prob"], case["response_mask"])
        for label, dtype in DTYPES.items():
            case[label] = _outputs(ns, defaults, case["settings"], *inputs, dtype)
        case["old_log_prob"] = _encode(case["old_log_prob"])
        case["rollout_log_prob"] = _encode(case["rollout_log_prob"])
    document = {
        **provenance,
        "torch_version": torch.__version__,
        "settings_classes": "areal.api.cli_args.PPOActorConfig (use_decoupled_loss, rejection_sampling) and "
                            "RejectionSamplingConfig",
        "defaults": defaults,
        "cases": cases,
    }
    write_cases(document, out)
    print(f"{len(cases)} cases -> {out}")


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2] if len(sys.argv) > 2 else "tests/data/areal_parity_cases.json")
