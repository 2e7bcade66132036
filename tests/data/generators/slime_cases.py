"""Parity cases for slime's train/rollout mismatch keys (`slime`, `slime-mis`), produced by slime's own code.

Run by hand, never by CI or the tests, with the interpreter of a scratch venv that holds torch (slime itself is
not installed: it pulls in Megatron, ray and sglang):

    python3 -m venv SCRATCH/venv && SCRATCH/venv/bin/pip install torch==2.13.0 numpy   # the CPU wheel
    SCRATCH/venv/bin/python tests/data/generators/slime_cases.py SLIME_GIT_DIR tests/data/slime_parity_cases.json

SLIME_GIT_DIR is a clone (bare is fine) of github.com/THUDM/slime holding commit 624b824a (COMMIT below). The
script reads the files of that commit with `git show`, takes the functions it needs out of their syntax trees,
compiles them unchanged under their original file names and executes them in namespaces holding torch and stubs
for what is not exercised (Megatron's `mpu` with one context-parallel rank, `torch.distributed.all_reduce` as a
no-op for one process, the policy's forward pass). Nothing of slime's arithmetic is re-written here:

* `loss.py:loss_function` and `policy_loss_function` run whole; the forward pass (`get_log_probs_and_entropy`)
  is stubbed to return the old log-probs as the current policy's (the first optimizer step of a rollout) and the
  PPO surrogate (`compute_policy_loss`) to return zeros: neither feeds a mismatch key;
* the TIS hook is found by slime's own `load_function` (`slime/utils/misc.py`) from `custom_tis_function_path`,
  in stub modules holding `loss.py`'s `vanilla_tis_function` / `icepop_function` and all of
  `examples/train_infer_mismatch_helper/mis.py`'s functions (its `compute_mis_weights_with_cp` imports
  `cp_utils`' `all_gather_with_cp` / `slice_log_prob_with_cp`, taken from `cp_utils.py` too);
* the reducer is `cp_utils.py:get_sum_of_sample_mean`, and the step's reduction
  `observability/train_metric_utils.py:reduce_train_step_metrics`; `train_one_step` (`model.py`) names each key
  `train/` + the loss's key, which is the one line of glue written here, with `rollout_mask_sums` (one rollout per
  sample, as `ray/rollout.py` builds it when samples carry no `rollout_id`) and `step_global_batch_size` (rows).

The two settings slime refuses in `slime_validate_args` (`utils/arguments.py`) are not run: the script checks the
assert message is in that file at the commit and records it.
"""

from __future__ import annotations

import ast
import functools
import hashlib
import importlib
import subprocess
import sys
import types
from argparse import Namespace
from collections.abc import Callable, Iterator, Sequence
from typing import Any

import numpy as np
import torch
import torch.nn.functional as F
from casefile import encode as _encode
from casefile import f32 as _f32
from casefile import mask as _mask
from casefile import write_cases

COMMIT = "624b824a898ab0ec1fcb4d373004c7f3852bf515"
DTYPES = {"fp32": torch.float32, "fp64": torch.float64}
PROMPT = 3  # prompt tokens per sample (total_lengths); no key reads them
LOADED: list[dict] = []
CURRENT: dict[str, list[torch.Tensor]] = {}  # the stubbed forward pass's log-probs


def _show(git_dir: str, path: str) -> str:
    return subprocess.run(["git", "-C", git_dir, "show", f"{COMMIT}:{path}"], check=True, capture_output=True,
                          text=True).stdout


def _load(git_dir: str, path: str, names: Sequence[str], namespace: dict) -> dict:
    """Compile the named top-level functions (and assignments) of `path` at COMMIT into `namespace`."""
    source = _show(git_dir, path)
    tree = ast.parse(source, path)
    found = {}
    for node in tree.body:
        name = getattr(node, "name", None)
        if name is None and isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name):
            name = node.target.id
        if name in names:
            found[name] = node
    missing = set(names) - set(found)
    if missing:
        raise SystemExit(f"{path} at {COMMIT[:8]} has no {sorted(missing)}: slime changed")
    for name in names:
        node = found[name]
        exec(compile(ast.Module(body=[node], type_ignores=[]), path, "exec"), namespace)
        segment = ast.get_source_segment(source, node)
        LOADED.append({"file": path, "function": name, "lines": [node.lineno, node.end_lineno],
                       "sha256": hashlib.sha256(segment.encode()).hexdigest()})
    return namespace


class _Mpu:
    """Megatron's parallel state for one process: no tensor, context or data parallelism."""

    @staticmethod
    def get_context_parallel_world_size() -> int:
        return 1

    @staticmethod
    def get_context_parallel_group() -> None:
        return None

    @staticmethod
    def get_data_parallel_world_size(with_context_parallel: bool = False) -> int:
        return 1


def _dist() -> types.SimpleNamespace:
    return types.SimpleNamespace(all_reduce=lambda tensor, group=None, op=None: None)  # one process


def _module(name: str, **attrs) -> types.ModuleType:
    module = types.ModuleType(name)
    module.__dict__.update(attrs)
    sys.modules[name] = module
    return module


def _slime(git_dir: str) -> dict:
    """slime's functions at COMMIT, wired as the policy loss finds them."""
    cp = _load(git_dir, "slime/backends/megatron_utils/cp_utils.py",
               ["get_logits_and_tokens_offset_with_cp", "get_sum_of_sample_mean", "all_gather_with_cp",
                "slice_log_prob_with_cp"],
               {"torch": torch, "dist": _dist(), "F": F, "mpu": _Mpu, "Callable": Callable, "Sequence": Sequence})
    for package in ("slime", "slime.backends", "slime.backends.megatron_utils", "examples",
                    "examples.train_infer_mismatch_helper"):
        _module(package)
    _module("slime.backends.megatron_utils.cp_utils", **cp)
    misc = _load(git_dir, "slime/utils/misc.py", ["load_function"],
                 {"importlib": importlib, "cache": functools.cache})
    mis_file = "examples/train_infer_mismatch_helper/mis.py"
    mis_names = [node.name for node in ast.parse(_show(git_dir, mis_file)).body if isinstance(node, ast.FunctionDef)]
    mis = _load(git_dir, mis_file, mis_names, {"torch": torch, "Any": Any})
    _module("examples.train_infer_mismatch_helper.mis", **mis)

    def get_log_probs_and_entropy(logits, *, args, unconcat_tokens, total_lengths, response_lengths,
                                  with_entropy=False, **kwargs):
        # The forward pass, stubbed: the current policy's log-probs are the old ones (first step of a rollout).
        current = CURRENT["log_probs"]
        return None, {"log_probs": [t.clone() for t in current], "entropy": [torch.zeros_like(t) for t in current]}

    def compute_policy_loss(ppo_kl, advantages, eps_clip, eps_clip_high, eps_clip_c=None):
        return torch.zeros_like(ppo_kl), torch.zeros_like(ppo_kl)  # the PPO surrogate feeds no mismatch key

    loss_ns = {
        "torch": torch, "dist": _dist(), "F": F, "mpu": _Mpu, "Namespace": Namespace, "Callable": Callable,
        "Iterator": Iterator, "Any": Any, "RolloutBatch": dict, "checkpoint": None,
        "load_function": misc["load_function"], "get_sum_of_sample_mean": cp["get_sum_of_sample_mean"],
        "all_gather_with_cp": cp["all_gather_with_cp"], "get_log_probs_and_entropy": get_log_probs_and_entropy,
        "compute_policy_loss": compute_policy_loss,
    }
    _load(git_dir, "slime/backends/megatron_utils/loss.py",
          ["_LOG_PROB_CAPTURE", "_maybe_capture_log_probs", "get_rollout_top_p_logprob_kwargs",
           "vanilla_tis_function", "icepop_function", "policy_loss_function", "loss_function"], loss_ns)
    _module("slime.backends.megatron_utils.loss", **loss_ns)
    metric_ns = _load(git_dir, "slime/observability/train_metric_utils.py", ["reduce_train_step_metrics"],
                      {"dist": _dist(), "torch": torch})
    return {"loss_function": loss_ns["loss_function"], "reduce": metric_ns["reduce_train_step_metrics"],
            "arguments": _show(git_dir, "slime/utils/arguments.py"),
            "mis_yaml": _show(git_dir, "examples/train_infer_mismatch_helper/mis.yaml")}


# slime's argparse defaults at COMMIT for the fields the policy loss reads (slime/utils/arguments.py).
ARGS = dict(
    use_tis=False, tis_clip=2.0, tis_clip_low=0, custom_tis_function_path=None, get_mismatch_metrics=False,
    use_rollout_logprobs=False, calculate_per_token_loss=False,
    loss_type="policy_loss", recompute_loss_function=False, allgather_cp=False, rollout_top_p=1.0,
    use_opsm=False, advantage_estimator="grpo", eps_clip=0.2, eps_clip_high=0.28, eps_clip_c=None,
    custom_pg_loss_reducer_function_path=None, entropy_coef=0.0, use_kl_loss=False,
)
MIS_PATH = "examples.train_infer_mismatch_helper.mis.compute_mis_weights_with_cp"
REFUSED = ("use_rollout_logprobs and use_tis cannot be set at the same time.",
           "custom_tis_function_path must be set when get_mismatch_metrics is set")


def _args(family: str, settings: dict, mis_defaults: dict) -> Namespace:
    values = dict(ARGS)
    if family == "slime-mis":  # mis.yaml through custom_config_path, then the case's fields
        values.update(mis_defaults, custom_tis_function_path=MIS_PATH)
    values.update(settings)
    return Namespace(**values)


def _refusal(args: Namespace, arguments: str) -> str | None:
    """slime_validate_args' two checks on these fields, by their messages in arguments.py."""
    message = None
    if args.use_rollout_logprobs and args.use_tis:
        message = REFUSED[0]
    elif args.get_mismatch_metrics and args.custom_tis_function_path is None:
        message = REFUSED[1]
    if message is not None:
        assert message in arguments, f"{message!r} is not in slime/utils/arguments.py at {COMMIT[:8]}"
    return message


def _outputs(slime: dict, family: str, settings: dict, old, rollout, mask, dtype, mis_defaults) -> dict:
    args = _args(family, settings, mis_defaults)
    refused = _refusal(args, slime["arguments"])
    if refused:
        return {"error": "AssertionError", "message": refused}
    rows = len(old)
    # A sample is its response: a row ends at its last loss-mask-1 token (the padding after it is no part of it;
    # a 0 inside it, a tool token, is). An empty row is a sample of length 0.
    lengths = [max((t + 1 for t, m in enumerate(row) if m), default=0) for row in mask]
    old_rows = [torch.tensor(r[:n], dtype=dtype) for r, n in zip(old, lengths, strict=True)]
    masks = [torch.tensor(m[:n], dtype=torch.int) for m, n in zip(mask, lengths, strict=True)]
    batch = {
        "advantages": [torch.zeros(n, dtype=dtype) for n in lengths],
        "rollout_log_probs": [torch.tensor(r[:n], dtype=dtype) for r, n in zip(rollout, lengths, strict=True)],
        "unconcat_tokens": [None] * rows,
        "response_lengths": lengths,
        "total_lengths": [n + PROMPT for n in lengths],
        "loss_masks": masks,
        # ray/rollout.py: one rollout per sample, its mask total; actor.py: a float32 tensor.
        "rollout_mask_sums": torch.tensor([float(sum(m)) for m in mask], dtype=torch.float32),
    }
    if not args.use_rollout_logprobs or args.get_mismatch_metrics:
        batch["log_probs"] = old_rows  # the recomputed old log-probs
    CURRENT["log_probs"] = old_rows
    logits = torch.zeros(1, dtype=dtype)  # only its device is read (the forward pass is stubbed)
    try:
        _, _, logged = slime["loss_function"](args, batch, 1, rows, logits)
        reduced = slime["reduce"]([logged], calculate_per_token_loss=args.calculate_per_token_loss,
                                  step_global_batch_size=rows, cp_size=1, dp_with_cp_group=None)
    except (ValueError, AssertionError, TypeError) as error:
        return {"error": type(error).__name__, "message": str(error)}
    skip = {"loss", "pg_loss", "entropy_loss", "pg_clipfrac", "ppo_kl"}  # the PPO loss's own keys
    return {"metrics": {f"train/{key}": _encode(float(value)) for key, value in reduced.items() if key not in skip}}


def _base(seed: int = 23, lengths=(8, 6, 3, 1), width: int = 8, scale: float = 0.45):
    rng = np.random.default_rng(seed)
    mask = _mask(lengths, width)
    old = rng.uniform(-3.0, -0.05, size=(len(lengths), width))
    rollout = np.minimum(old - rng.normal(0.1, scale, size=old.shape), -0.01)
    return _f32(old), _f32(rollout), mask


def _edge_inputs() -> dict:
    """Inputs shared by both families: empty rows, catastrophic and non-finite tokens, overflow, long rows."""
    old, rollout, _ = _base(seed=5)
    inputs = {"empty_row": (old, rollout, _mask((8, 5, 0, 2), 8)), "all_empty": (old, rollout, _mask((0, 0, 0, 0), 8))}
    old, rollout, mask = _base(seed=7)
    rollout[0][2] = old[0][2] - 25.0
    rollout[1][1] = old[1][1] + 25.0
    rollout[2][0] = float("-inf")
    inputs["catastrophic"] = (old, rollout, mask)
    # d = 90 per token overflows exp in float32 only, d = 800 in float64 too; a row summing far past ±20.
    width = 12
    inputs["overflow"] = ([[-1.0] * width, [-1.0] * width, [-1.0] * width, [-2.0] * width],
                          [[-91.0] * width, [-801.0] * width, [-3.5] * width, [-1.9] * width],
                          _mask((12, 3, 12, 5), width))
    old, rollout, mask = _base(seed=11)
    rollout[0][3], rollout[1][0], old[3][0] = float("nan"), float("nan"), float("-inf")
    inputs["nonfinite"] = (old, rollout, mask)
    old, rollout, mask = _base(seed=17)
    mask[0][2] = mask[0][3] = mask[1][0] = 0  # tool tokens inside a response: not trained on, still in the sample
    rollout[0][2] = old[0][2] - 6.0
    inputs["tool_tokens"] = (old, rollout, mask)
    old, rollout, mask = _base(seed=13)
    old[1], rollout[1] = [-1.0] * 8, [-1.0] * 8  # a row of ratio exactly 1
    rollout[2][1] = old[2][1] + 120.0  # exp(-120) underflows float32 to 0
    inputs["on_bound_underflow"] = (old, rollout, mask)
    rng = np.random.default_rng(4772)
    old = rng.uniform(-2.5, -0.05, size=(3, 96))
    inputs["length_effect"] = (_f32(old), _f32(old - rng.normal(0.012, 0.02, size=old.shape)), _mask((96, 48, 12), 96))
    return inputs


ICEPOP = "slime.backends.megatron_utils.loss.icepop_function"
VANILLA = "slime.backends.megatron_utils.loss.vanilla_tis_function"


def _cases() -> list[dict]:
    cases = []

    def add(family, name, settings, inputs):
        old, rollout, mask = inputs
        cases.append({"family": family, "name": f"{family}:{name}", "settings": settings, "old_log_prob": old,
                      "rollout_log_prob": rollout, "response_mask": mask})

    base = _base()
    edge = _edge_inputs()
    # semantics slime: the loss's own hook.
    add("slime", "defaults", {}, base)
    add("slime", "use_tis", {"use_tis": True}, base)
    add("slime", "use_tis_band", {"use_tis": True, "tis_clip": 1.25, "tis_clip_low": 0.8}, base)
    add("slime", "vanilla_by_path", {"use_tis": True, "custom_tis_function_path": VANILLA}, base)
    add("slime", "icepop", {"use_tis": True, "custom_tis_function_path": ICEPOP}, base)
    add("slime", "icepop_band", {"use_tis": True, "custom_tis_function_path": ICEPOP, "tis_clip": 1.25,
                                 "tis_clip_low": 0.8}, base)
    add("slime", "icepop_metrics_only", {"get_mismatch_metrics": True, "custom_tis_function_path": ICEPOP}, base)
    add("slime", "per_token_loss", {"use_tis": True, "calculate_per_token_loss": True}, base)
    add("slime", "rollout_logprobs", {"use_rollout_logprobs": True}, base)
    add("slime", "rollout_logprobs_metrics", {"use_rollout_logprobs": True, "get_mismatch_metrics": True,
                                              "custom_tis_function_path": ICEPOP}, base)
    add("slime", "low_above_clip", {"use_tis": True, "tis_clip": 1.0, "tis_clip_low": 1.5}, base)
    for name, inputs in edge.items():
        add("slime", f"{name}_use_tis", {"use_tis": True}, inputs)
        add("slime", f"{name}_icepop", {"use_tis": True, "custom_tis_function_path": ICEPOP, "tis_clip_low": 0.5},
            inputs)
    add("slime", "empty_row_per_token_loss", {"use_tis": True, "calculate_per_token_loss": True}, edge["empty_row"])
    add("slime", "ERR_rollout_logprobs_and_tis", {"use_tis": True, "use_rollout_logprobs": True}, base)
    add("slime", "ERR_metrics_without_function", {"get_mismatch_metrics": True}, base)

    # semantics slime-mis: the MIS helper, mis.yaml's settings by default.
    add("slime-mis", "defaults", {}, base)
    add("slime-mis", "off", {"use_tis": False}, base)
    add("slime-mis", "metrics_only", {"use_tis": False, "get_mismatch_metrics": True}, base)
    for level in ("sequence", "geometric"):
        add("slime-mis", f"{level}_level", {"tis_level": level, "rs_level": level, "tis_batch_normalize": level
                                            == "sequence"}, base)
    add("slime-mis", "geometric_tight", {"tis_level": "geometric", "rs_level": "geometric", "tis_lower_bound": 0.9999,
                                         "tis_upper_bound": 1.0001, "tis_batch_normalize": False}, base)
    for mode in ("clip", "mask"):
        add("slime-mis", f"{mode}_mode", {"tis_mode": mode}, base)
        add("slime-mis", f"{mode}_sequence", {"tis_mode": mode, "tis_level": "sequence"}, base)
    add("slime-mis", "mixed_levels", {"tis_level": "token", "rs_level": "sequence", "rs_upper_bound": 3.0,
                                      "rs_lower_bound": 0.2}, base)
    add("slime-mis", "no_rs", {"use_rs": False}, base)
    add("slime-mis", "no_veto_no_norm", {"rs_veto_threshold": None, "tis_batch_normalize": False}, base)
    add("slime-mis", "default_lower_bound", {"tis_mode": "clip", "tis_lower_bound": None, "tis_upper_bound": 4.0},
        base)
    add("slime-mis", "veto_catches", {"rs_veto_threshold": 0.5}, base)
    add("slime-mis", "per_token_loss", {"calculate_per_token_loss": True}, base)
    add("slime-mis", "sequence_per_token_loss", {"tis_level": "sequence", "rs_level": "sequence",
                                                 "calculate_per_token_loss": True}, base)
    for name, inputs in edge.items():
        add("slime-mis", f"{name}_defaults", {}, inputs)
        add("slime-mis", f"{name}_sequence_mask", {"tis_level": "sequence", "rs_level": "sequence",
                                                   "tis_mode": "mask"}, inputs)
    add("slime-mis", "empty_row_metrics_only", {"use_tis": False, "get_mismatch_metrics": True}, edge["empty_row"])
    add("slime-mis", "ERR_invalid_level", {"tis_level": "seq"}, base)
    add("slime-mis", "ERR_invalid_rs_level", {"rs_level": "tok"}, base)
    add("slime-mis", "ERR_unsupported_mode", {"tis_mode": "cap"}, base)
    add("slime-mis", "ERR_clip_bounds_reversed", {"tis_mode": "clip", "tis_lower_bound": 3.0}, base)
    add("slime-mis", "ERR_geometric_batch_normalize", {"tis_level": "geometric"}, base)
    add("slime-mis", "ERR_rollout_logprobs_and_tis", {"use_rollout_logprobs": True}, base)
    return cases


def main(git_dir: str, out: str) -> None:
    slime = _slime(git_dir)
    import yaml  # mis.yaml, read as custom_config_path reads it (yaml.safe_load)

    mis_defaults = yaml.safe_load(slime["mis_yaml"])
    cases = _cases()
    for case in cases:
        inputs = (case["old_log_prob"], case["rollout_log_prob"], case["response_mask"])
        for label, dtype in DTYPES.items():
            case[label] = _outputs(slime, case["family"], case["settings"], *inputs, dtype, mis_defaults)
        case["old_log_prob"] = _encode(case["old_log_prob"])
        case["rollout_log_prob"] = _encode(case["rollout_log_prob"])
    document = {
        "slime_commit": COMMIT,
        "torch_version": torch.__version__,
        "source": LOADED,
        "defaults": {"slime": {k: ARGS[k] for k in ("use_tis", "tis_clip", "tis_clip_low", "custom_tis_function_path",
                                                     "get_mismatch_metrics", "use_rollout_logprobs",
                                                     "calculate_per_token_loss")},
                     "slime-mis": mis_defaults},
        "cases": cases,
    }
    write_cases(document, out)
    print(f"{len(cases)} cases -> {out}")


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2] if len(sys.argv) > 2 else "tests/data/slime_parity_cases.json")
