"""Parity cases for Miles's train/rollout mismatch keys (`miles`, `miles-mis`), produced by Miles's own code.

Run by hand, never by CI or the tests, with the interpreter of a scratch venv that holds torch (Miles itself is
not installed: it pulls in Megatron, ray and sglang):

    python3 -m venv SCRATCH/venv && SCRATCH/venv/bin/pip install torch==2.13.0 numpy pyyaml   # the CPU wheel
    TORCH_COMPILE_DISABLE=1 SCRATCH/venv/bin/python tests/data/generators/miles_cases.py MILES_GIT_DIR \
        tests/data/miles_parity_cases.json

MILES_GIT_DIR is a clone (bare is fine) of github.com/radixark/miles holding commit 31f1ca96 (COMMIT below). The
script reads the files of that commit with `git show`, takes the functions it needs out of their syntax trees,
compiles them unchanged under their original file names and executes them in namespaces holding torch and stubs
for what is not exercised (Miles's parallel state with one context-parallel and one data-parallel rank, the
policy's forward pass). Nothing of Miles's arithmetic is re-written here:

* `loss.py:loss_function` and `loss_hub/losses.py:policy_loss_function` run whole; the forward pass
  (`get_log_probs_and_entropy`) is stubbed to return the old log-probs as the current policy's (the first
  optimizer step of a rollout); the PPO surrogate is `math_utils.py:compute_policy_loss` itself (zero advantages);
* `math_utils.py`'s `compute_approx_kl` (train_rollout_kl) and `compute_ess_ratio_contribution` (ess_ratio) run as
  written. Both carry `@torch.compile(dynamic=True)` or are called by one that does: TORCH_COMPILE_DISABLE=1 makes
  the decorator a no-op, so they run eagerly (the cases record eager torch, not a fused kernel's rounding);
* the TIS hook is found by Miles's own `load_function` (`miles/utils/misc.py`, with an empty registry) from
  `custom_tis_function_path`: `loss_hub/corrections.py`'s `vanilla_tis_function` / `icepop_function`, or
  `examples/infra_features/train_infer_mismatch_helper/mis.py`'s `compute_mis_weights_with_cp` (its lazy import of
  `cp_utils` finds `cp_utils.py`'s functions, loaded from that file);
* the reducer is `cp_utils.py:get_sum_of_sample_mean`, the step's reduction `log_utils.py:aggregate_train_losses`
  (divided by the rollout count, or per token by the token count, as `megatron_utils/model.py:train_one_step`
  passes it) and the `train/` names `log_utils.py:log_train_step` (should_log=False: nothing is sent anywhere).
  `rollout_mask_sums` is one rollout per sample (as `ray/rollout/train_data_conversion.py` builds it when samples
  carry no `rollout_id`), a float32 tensor as `backends/training_utils/data.py` makes it.

The two settings Miles refuses in `parse_args` (`miles/utils/arguments.py`) are not run: the script checks the
assert message is in that file at the commit and records it. The inputs are slime's generator's (the same
`_base` and edge inputs, imported from slime_cases.py beside this file) plus one of k3 values past the clamp.
"""

from __future__ import annotations

import ast
import hashlib
import importlib
import inspect
import subprocess
import sys
import types
from argparse import Namespace
from collections.abc import Callable
from pathlib import Path
from typing import Any, Protocol

import torch
import torch.nn.functional as F

sys.path.insert(0, str(Path(__file__).parent))
from casefile import write_cases
from slime_cases import _base, _edge_inputs, _encode  # noqa: E402  (the same inputs as slime's)

COMMIT = "31f1ca961a94cb860cec3b2dea34ec332bfa8f76"
DTYPES = {"fp32": torch.float32, "fp64": torch.float64}
PROMPT = 3  # prompt tokens per sample (total_lengths); no key reads them
LOADED: list[dict] = []
CURRENT: dict[str, list[torch.Tensor]] = {}  # the stubbed forward pass's log-probs
TRAINING_UTILS = "miles/backends/training_utils"
MIS_FILE = "examples/infra_features/train_infer_mismatch_helper/mis.py"


def _show(git_dir: str, path: str) -> str:
    return subprocess.run(["git", "-C", git_dir, "show", f"{COMMIT}:{path}"], check=True, capture_output=True,
                          text=True).stdout


def _load(git_dir: str, path: str, names: list[str], namespace: dict) -> dict:
    """Compile the named top-level functions (and assignments) of `path` at COMMIT into `namespace`."""
    source = _show(git_dir, path)
    tree = ast.parse(source, path)
    found = {}
    for node in tree.body:
        name = getattr(node, "name", None)
        if name is None and isinstance(node, ast.Assign) and isinstance(node.targets[0], ast.Name):
            name = node.targets[0].id
        if name in names:
            found[name] = node
    missing = set(names) - set(found)
    if missing:
        raise SystemExit(f"{path} at {COMMIT[:8]} has no {sorted(missing)}: Miles changed")
    for name in names:
        node = found[name]
        exec(compile(ast.Module(body=[node], type_ignores=[]), path, "exec"), namespace)
        segment = ast.get_source_segment(source, node)
        LOADED.append({"file": path, "function": name, "lines": [node.lineno, node.end_lineno],
                       "sha256": hashlib.sha256(segment.encode()).hexdigest()})
    return namespace


def _group(size: int = 1, rank: int = 0) -> types.SimpleNamespace:
    return types.SimpleNamespace(size=size, rank=rank, group=None)


# Miles's parallel state for one process: no tensor, context or data parallelism.
PARALLEL = types.SimpleNamespace(cp=_group(), intra_dp=_group(), intra_dp_cp=_group(), is_ulysses_cp=False,
                                 is_pp_last_stage=True,
                                 effective_dp_cp=types.SimpleNamespace(groups_inner_to_outer=[]))


def _dist() -> types.SimpleNamespace:
    return types.SimpleNamespace(all_reduce=lambda tensor, group=None, op=None: None, get_rank=lambda: 0,
                                 ReduceOp=types.SimpleNamespace(SUM="sum"))


def _module(name: str, **attrs) -> types.ModuleType:
    module = types.ModuleType(name)
    module.__dict__.update(attrs)
    sys.modules[name] = module
    return module


def _miles(git_dir: str) -> dict:
    """Miles's functions at COMMIT, wired as the policy loss finds them."""
    base = {"torch": torch, "dist": _dist(), "F": F, "Callable": Callable, "get_parallel_state": lambda: PARALLEL}
    cp = _load(git_dir, f"{TRAINING_UTILS}/cp_utils.py",
               ["get_logits_and_tokens_offset_with_cp", "_slice_loss_mask_for_local_cp",
                "slice_loss_masks_for_local_cp", "get_sum_of_sample_mean", "get_local_response_loss_masks",
                "all_gather_with_cp", "slice_log_prob_with_cp"], dict(base))
    for package in ("miles", "miles.backends", "miles.backends.training_utils",
                    "miles.backends.training_utils.loss_hub", "examples", "examples.infra_features",
                    "examples.infra_features.train_infer_mismatch_helper"):
        _module(package)
    _module("miles.backends.training_utils.cp_utils", **cp)
    math_ns = _load(git_dir, f"{TRAINING_UTILS}/loss_hub/math_utils.py",
                    ["_LOG_RATIO_EXP_CLAMP", "_safe_clamp_log_ratio", "_safe_exp_neg_ppo_kl",
                     "compute_ess_ratio_contribution", "compute_approx_kl", "compute_policy_loss"],
                    {**base, "slice_loss_masks_for_local_cp": cp["slice_loss_masks_for_local_cp"]})
    corrections = _load(git_dir, f"{TRAINING_UTILS}/loss_hub/corrections.py",
                        ["vanilla_tis_function", "icepop_function"], {"torch": torch, "Namespace": Namespace,
                                                                      "Any": Any})
    _module("miles.backends.training_utils.loss_hub.corrections", **corrections)
    mis_names = [node.name for node in ast.parse(_show(git_dir, MIS_FILE)).body if isinstance(node, ast.FunctionDef)]
    mis = _load(git_dir, MIS_FILE, mis_names, {"torch": torch, "Any": Any})
    _module("examples.infra_features.train_infer_mismatch_helper.mis", **mis)
    misc = _load(git_dir, "miles/utils/misc.py", ["load_function"],
                 {"importlib": importlib, "inspect": inspect, "function_registry": {}})

    def get_log_probs_and_entropy(logits, *, args, unconcat_tokens, total_lengths, response_lengths,
                                  with_entropy=False, **kwargs):
        # The forward pass, stubbed: the current policy's log-probs are the old ones (first step of a rollout).
        current = CURRENT["log_probs"]
        return {"log_probs": [t.clone() for t in current], "entropy": [torch.zeros_like(t) for t in current]}

    losses = {**base, "Namespace": Namespace, "Protocol": Protocol, "RolloutBatch": dict,
              "all_gather_with_cp": cp["all_gather_with_cp"],
              "get_local_response_loss_masks": cp["get_local_response_loss_masks"],
              "get_sum_of_sample_mean": cp["get_sum_of_sample_mean"],
              "vanilla_tis_function": corrections["vanilla_tis_function"],
              "get_log_probs_and_entropy": get_log_probs_and_entropy, "get_values": None,
              "compute_approx_kl": math_ns["compute_approx_kl"],
              "compute_ess_ratio_contribution": math_ns["compute_ess_ratio_contribution"],
              "compute_gspo_kl": None, "compute_opsm_mask": None,
              "compute_policy_loss": math_ns["compute_policy_loss"], "load_function": misc["load_function"]}
    _load(git_dir, f"{TRAINING_UTILS}/loss_hub/losses.py", ["policy_loss_function", "get_loss_function"], losses)
    loss = _load(git_dir, f"{TRAINING_UTILS}/loss.py", ["loss_function"],
                 {**base, "Namespace": Namespace, "RolloutBatch": dict, "checkpoint": None,
                  "get_sum_of_sample_mean": cp["get_sum_of_sample_mean"],
                  "get_loss_function": losses["get_loss_function"], "is_multi_lora_enabled": lambda args: False})
    multi_pg = types.SimpleNamespace(all_reduce=lambda values, groups, op=None: None)
    logs = _load(git_dir, f"{TRAINING_UTILS}/log_utils.py", ["aggregate_train_losses", "log_train_step"],
                 {**base, "Namespace": Namespace, "MultiPGUtil": multi_pg,
                  "tracking": types.SimpleNamespace(log=None), "logger": None})
    return {"loss_function": loss["loss_function"], "aggregate": logs["aggregate_train_losses"],
            "log": logs["log_train_step"], "arguments": _show(git_dir, "miles/utils/arguments.py"),
            "mis_yaml": _show(git_dir, MIS_FILE.replace("mis.py", "mis.yaml"))}


# Miles's argparse defaults at COMMIT for the fields the policy loss reads (miles/utils/arguments.py).
ARGS = dict(
    use_tis=False, tis_clip=2.0, tis_clip_low=0, custom_tis_function_path=None, get_mismatch_metrics=False,
    use_rollout_logprobs=False, calculate_per_token_loss=False,
    loss_type="policy_loss", recompute_loss_function=False, allgather_cp=False, skip_actor_forward_only=False,
    use_opsm=False, advantage_estimator="grpo", eps_clip=0.2, eps_clip_high=0.28, eps_clip_c=None,
    custom_pg_loss_reducer_function_path=None, entropy_coef=0.0, observe_training_entropy=False, use_kl_loss=False,
    qkv_format="thd", true_on_policy_mode=False, use_dynamic_global_batch_size=False,
)
FIELDS = ("use_tis", "tis_clip", "tis_clip_low", "custom_tis_function_path", "get_mismatch_metrics",
          "use_rollout_logprobs", "calculate_per_token_loss")
MIS_PATH = "examples.infra_features.train_infer_mismatch_helper.mis.compute_mis_weights_with_cp"
ICEPOP = "miles.backends.training_utils.loss_hub.corrections.icepop_function"
VANILLA = "miles.backends.training_utils.loss_hub.corrections.vanilla_tis_function"
REFUSED = ("use_rollout_logprobs and use_tis cannot be set at the same time.",
           "custom_tis_function_path must be set when get_mismatch_metrics is set")
SKIP = {"loss", "pg_loss", "entropy_loss", "pg_clipfrac", "ppo_kl", "grad_norm", "step"}  # PPO's and the step's


def _args(family: str, settings: dict, mis_defaults: dict) -> Namespace:
    values = dict(ARGS)
    if family == "miles-mis":  # mis.yaml through custom_config_path, then the case's fields
        values.update(mis_defaults, custom_tis_function_path=MIS_PATH)
    values.update(settings)
    return Namespace(**values)


def _refusal(args: Namespace, arguments: str) -> str | None:
    """parse_args' two checks on these fields, by their messages in arguments.py."""
    message = None
    if args.use_rollout_logprobs and args.use_tis:
        message = REFUSED[0]
    elif args.get_mismatch_metrics and args.custom_tis_function_path is None:
        message = REFUSED[1]
    if message is not None:
        assert message in arguments, f"{message!r} is not in miles/utils/arguments.py at {COMMIT[:8]}"
    return message


def _outputs(miles: dict, family: str, settings: dict, old, rollout, mask, dtype, mis_defaults) -> dict:
    args = _args(family, settings, mis_defaults)
    refused = _refusal(args, miles["arguments"])
    if refused:
        return {"error": "AssertionError", "message": refused}
    rows = len(old)
    # A sample is its response: a row ends at its last loss-mask-1 token (a 0 inside it, a tool token, is part
    # of it). An empty row is a sample of length 0.
    lengths = [max((t + 1 for t, m in enumerate(row) if m), default=0) for row in mask]
    old_rows = [torch.tensor(r[:n], dtype=dtype) for r, n in zip(old, lengths, strict=True)]
    batch = {
        "advantages": [torch.zeros(n, dtype=dtype) for n in lengths],
        "rollout_log_probs": [torch.tensor(r[:n], dtype=dtype) for r, n in zip(rollout, lengths, strict=True)],
        "unconcat_tokens": [None] * rows,
        "response_lengths": lengths,
        "total_lengths": [n + PROMPT for n in lengths],
        "loss_masks": [torch.tensor(m[:n], dtype=torch.int) for m, n in zip(mask, lengths, strict=True)],
        "log_probs": old_rows,  # the trainer's recomputed old log-probs
        # train_data_conversion.py: one rollout per sample, its mask total; data.py: a float32 tensor.
        "rollout_mask_sums": torch.tensor([float(sum(m)) for m in mask], dtype=torch.float32),
    }
    CURRENT["log_probs"] = old_rows
    logits = torch.zeros(1, dtype=dtype)  # only its device is read (the forward pass is stubbed)
    try:
        _, _, logged = miles["loss_function"](args, batch, 1, logits, apply_megatron_loss_scaling=True,
                                              num_rollouts=rows)
        # megatron_utils/model.py: per-rollout means, or the legacy per-token count with calculate_per_token_loss.
        reduced = miles["aggregate"]([logged], None if args.calculate_per_token_loss else rows)
        named = miles["log"](args, reduced, 0.0, 0, 0, 1, should_log=False)
    except (ValueError, AssertionError, TypeError) as error:
        return {"error": type(error).__name__, "message": str(error)}
    return {"metrics": {key: _encode(float(value)) for key, value in named.items()
                        if key.removeprefix("train/") not in SKIP}}


def _k3_clamp_inputs():
    """Tokens whose k3 passes the ±10 clamp inside the ±20 log-ratio clamp, both signs, and one just below."""
    old, rollout, mask = _base(seed=29)
    rollout[0][1] = old[0][1] - 5.0  # d = 5: exp(5) - 6 = 142 -> 10
    rollout[0][4] = old[0][4] + 15.0  # d = -15: 14 -> 10
    rollout[1][2] = old[1][2] - 2.5  # d = 2.5: 8.68, under the clamp
    return old, rollout, mask


def _cases() -> list[dict]:
    cases = []

    def add(family, name, settings, inputs):
        old, rollout, mask = inputs
        cases.append({"family": family, "name": f"{family}:{name}", "settings": settings, "old_log_prob": old,
                      "rollout_log_prob": rollout, "response_mask": mask})

    base = _base()
    edge = {**_edge_inputs(), "k3_clamp": _k3_clamp_inputs()}
    # semantics miles: the policy loss and its own hook.
    add("miles", "defaults", {}, base)
    add("miles", "use_tis", {"use_tis": True}, base)
    add("miles", "use_tis_band", {"use_tis": True, "tis_clip": 1.25, "tis_clip_low": 0.8}, base)
    add("miles", "vanilla_by_path", {"use_tis": True, "custom_tis_function_path": VANILLA}, base)
    add("miles", "icepop", {"use_tis": True, "custom_tis_function_path": ICEPOP}, base)
    add("miles", "icepop_band", {"use_tis": True, "custom_tis_function_path": ICEPOP, "tis_clip": 1.25,
                                 "tis_clip_low": 0.8}, base)
    add("miles", "icepop_metrics_only", {"get_mismatch_metrics": True, "custom_tis_function_path": ICEPOP}, base)
    add("miles", "per_token_loss", {"use_tis": True, "calculate_per_token_loss": True}, base)
    add("miles", "defaults_per_token_loss", {"calculate_per_token_loss": True}, base)
    add("miles", "rollout_logprobs", {"use_rollout_logprobs": True}, base)
    add("miles", "rollout_logprobs_metrics", {"use_rollout_logprobs": True, "get_mismatch_metrics": True,
                                              "custom_tis_function_path": ICEPOP}, base)
    add("miles", "low_above_clip", {"use_tis": True, "tis_clip": 1.0, "tis_clip_low": 1.5}, base)
    for name, inputs in edge.items():
        add("miles", f"{name}_defaults", {}, inputs)
        add("miles", f"{name}_use_tis", {"use_tis": True}, inputs)
        add("miles", f"{name}_icepop", {"use_tis": True, "custom_tis_function_path": ICEPOP, "tis_clip_low": 0.5},
            inputs)
    add("miles", "empty_row_per_token_loss", {"use_tis": True, "calculate_per_token_loss": True}, edge["empty_row"])
    add("miles", "ERR_rollout_logprobs_and_tis", {"use_tis": True, "use_rollout_logprobs": True}, base)
    add("miles", "ERR_metrics_without_function", {"get_mismatch_metrics": True}, base)

    # semantics miles-mis: the MIS helper, mis.yaml's settings by default.
    add("miles-mis", "defaults", {}, base)
    add("miles-mis", "off", {"use_tis": False}, base)
    add("miles-mis", "metrics_only", {"use_tis": False, "get_mismatch_metrics": True}, base)
    for level in ("sequence", "geometric"):
        add("miles-mis", f"{level}_level", {"tis_level": level, "rs_level": level, "tis_batch_normalize": level
                                            == "sequence"}, base)
    for mode in ("clip", "mask"):
        add("miles-mis", f"{mode}_mode", {"tis_mode": mode}, base)
        add("miles-mis", f"{mode}_sequence", {"tis_mode": mode, "tis_level": "sequence"}, base)
    add("miles-mis", "mixed_levels", {"tis_level": "token", "rs_level": "sequence", "rs_upper_bound": 3.0,
                                      "rs_lower_bound": 0.2}, base)
    add("miles-mis", "no_rs", {"use_rs": False}, base)
    add("miles-mis", "no_veto_no_norm", {"rs_veto_threshold": None, "tis_batch_normalize": False}, base)
    add("miles-mis", "veto_catches", {"rs_veto_threshold": 0.5}, base)
    add("miles-mis", "per_token_loss", {"calculate_per_token_loss": True}, base)
    add("miles-mis", "metrics_only_rollout_logprobs", {"use_tis": False, "get_mismatch_metrics": True,
                                                       "use_rollout_logprobs": True}, base)
    for name, inputs in edge.items():
        add("miles-mis", f"{name}_defaults", {}, inputs)
        add("miles-mis", f"{name}_sequence_mask", {"tis_level": "sequence", "rs_level": "sequence",
                                                   "tis_mode": "mask"}, inputs)
    add("miles-mis", "ERR_invalid_level", {"tis_level": "seq"}, base)
    add("miles-mis", "ERR_unsupported_mode", {"tis_mode": "cap"}, base)
    add("miles-mis", "ERR_clip_bounds_reversed", {"tis_mode": "clip", "tis_lower_bound": 3.0}, base)
    add("miles-mis", "ERR_geometric_batch_normalize", {"tis_level": "geometric"}, base)
    add("miles-mis", "ERR_rollout_logprobs_and_tis", {"use_rollout_logprobs": True}, base)
    return cases


def main(git_dir: str, out: str) -> None:
    if not torch._dynamo.config.disable:
        raise SystemExit("run with TORCH_COMPILE_DISABLE=1 (eager torch; see the module docstring)")
    miles = _miles(git_dir)
    import yaml  # mis.yaml, read as custom_config_path reads it (yaml.safe_load)

    mis_defaults = yaml.safe_load(miles["mis_yaml"])
    cases = _cases()
    for case in cases:
        inputs = (case["old_log_prob"], case["rollout_log_prob"], case["response_mask"])
        for label, dtype in DTYPES.items():
            case[label] = _outputs(miles, case["family"], case["settings"], *inputs, dtype, mis_defaults)
        case["old_log_prob"] = _encode(case["old_log_prob"])
        case["rollout_log_prob"] = _encode(case["rollout_log_prob"])
    document = {
        "miles_commit": COMMIT,
        "torch_version": torch.__version__,
        "torch_compile": "disabled (TORCH_COMPILE_DISABLE=1): eager",
        "source": LOADED,
        "defaults": {"miles": {k: ARGS[k] for k in FIELDS}, "miles-mis": mis_defaults},
        "cases": cases,
    }
    write_cases(document, out)
    print(f"{len(cases)} cases -> {out}")


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2] if len(sys.argv) > 2 else "tests/data/miles_parity_cases.json")
