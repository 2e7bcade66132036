"""Parity cases for ms-swift's rollout off-policy metrics, produced by ms-swift's own code.

Run by hand, never by CI or the tests. Importing ms-swift's GRPO trainer pulls in transformers, trl, peft, vllm
and more, so the methods are read straight out of the wheel (`pip download` fetches it whatever the interpreter):

    python3 -m venv SCRATCH/venv && SCRATCH/venv/bin/pip install torch==2.13.0 numpy    # the CPU wheel
    SCRATCH/venv/bin/pip download ms-swift==4.6.0 --no-deps -d SCRATCH
    SCRATCH/venv/bin/python tests/data/generators/ms_swift_cases.py SCRATCH/ms_swift-4.6.0-py3-none-any.whl \
        tests/data/ms_swift_parity_cases.json

The script parses swift/rlhf_trainers/grpo_trainer.py with `ast`, takes four methods of `GRPOTrainer` unchanged,
compiles them under their original file name and executes them in a namespace holding torch (and `Dict`, an
annotation). They run bound to a `SimpleNamespace` standing in for the trainer, holding only the two settings they
read. Nothing of ms-swift's arithmetic is re-written here:

- `_compute_rollout_offpolicy_metrics`: the thirteen diagnostic keys (kl, k3_kl, the perplexities, chi2, ...);
- `_compute_is_correction_metrics`: is_weight_mean, ess, clipped_frac (only when a mode is set);
- `_apply_rollout_importance_sampling` (called through `_get_rollout_is_correction`'s one line,
  `old - rollout`) and `_compute_sequence_level_ratios`, which it and clipped_frac call.

What surrounds them is glue, taken from `_compute_loss_and_metrics` and `log` (their sha256 are recorded too):
one process, so the per-rank stack / `gather_for_metrics` / `nanmean(0)` of a micro-batch's values is the value
itself (rounded to the compute dtype by `torch.stack`); `log` then averages each key's per-micro-batch values in
float64 (`.double().mean`). Each micro-batch is `per_device_train_batch_size` consecutive rows in case order. The
trainer prefixes each key with `rollout_correction/`.

Padding: ms-swift zero-fills the rollout log-probs outside the completion (`build_rollout_logps`) and the trainer's
own log-probs there come from the model, always finite; every formula multiplies by the mask. So the positions a
case marks 0 are passed as rollout 0.0 and old -1.0, whatever the case's JSON holds there (the `nan_padding` case
stores NaN / inf at such positions to show a dump's padding cannot change a key).

The defaults come from `GRPOArgumentsMixin` (swift/rlhf_trainers/args_mixin.py) and `TrainArgumentsMixin`
(swift/trainers/arguments.py: per_device_train_batch_size), read from the syntax tree. ms-swift parses its
arguments with transformers' `HfArgumentParser`, i.e. argparse with the `Literal`'s values as choices; an unknown
mode is refused there, reproduced with argparse and the choices read from the dataclass (the message is kept from
"invalid choice" on: the list of choices is printed differently by each Python).
"""

from __future__ import annotations

import argparse
import ast
import contextlib
import hashlib
import io
import re
import sys
import types
import typing
import zipfile
from pathlib import Path

import numpy as np
import torch
from casefile import encode as _encode
from casefile import f32 as _f32
from casefile import mask as _mask
from casefile import write_cases

TRAINER = "swift/rlhf_trainers/grpo_trainer.py"
ARGS = "swift/rlhf_trainers/args_mixin.py"
TRAINING_ARGS = "swift/trainers/arguments.py"
METHODS = ("_compute_sequence_level_ratios", "_apply_rollout_importance_sampling", "_compute_rollout_offpolicy_metrics",
           "_compute_is_correction_metrics")
GLUE = ("_compute_loss_and_metrics", "_get_rollout_is_correction", "log")  # provenance only
FIELDS = ("rollout_importance_sampling_mode", "rollout_importance_sampling_threshold", "log_rollout_offpolicy_metrics")
MICRO = "per_device_train_batch_size"
DTYPES = {"fp32": torch.float32, "fp64": torch.float64}
PREFIX = "rollout_correction/"


def _class(tree: ast.Module, name: str) -> ast.ClassDef:
    return next(n for n in ast.walk(tree) if isinstance(n, ast.ClassDef) and n.name == name)


def _load(wheel: Path) -> tuple[dict, dict, tuple, dict]:
    """ms-swift's methods compiled unchanged; its defaults; the mode choices; the provenance of each method."""
    namespace = {"torch": torch, "Dict": dict, "Optional": typing.Optional}  # annotations only
    provenance = {}
    with zipfile.ZipFile(wheel) as archive:
        sources = {name: archive.read(name).decode() for name in (TRAINER, ARGS, TRAINING_ARGS)}
        meta = next(n for n in archive.namelist() if n.endswith(".dist-info/METADATA"))
        version = re.search(r"^Version: (.+)$", archive.read(meta).decode(), re.M)[1]
    source = sources[TRAINER]
    trainer = _class(ast.parse(source), "GRPOTrainer")
    for node in trainer.body:
        if isinstance(node, ast.FunctionDef) and node.name in (*METHODS, *GLUE):
            segment = ast.get_source_segment(source, node)
            provenance[node.name] = {"file": TRAINER, "class": "GRPOTrainer", "lines": [node.lineno, node.end_lineno],
                                     "sha256": hashlib.sha256(segment.encode()).hexdigest(),
                                     "called": node.name in METHODS}
            if node.name in METHODS:
                node.decorator_list = []
                exec(compile(ast.Module(body=[node], type_ignores=[]), TRAINER, "exec"), namespace)
    missing = [n for n in (*METHODS, *GLUE) if n not in provenance]
    if missing:
        raise SystemExit(f"{TRAINER} of the wheel lacks GRPOTrainer.{missing}: ms-swift changed")
    defaults, choices = {}, ()
    for path, cls, wanted in ((ARGS, "GRPOArgumentsMixin", FIELDS), (TRAINING_ARGS, "TrainArgumentsMixin", (MICRO,))):
        for item in _class(ast.parse(sources[path]), cls).body:
            if isinstance(item, ast.AnnAssign) and isinstance(item.target, ast.Name) and item.target.id in wanted:
                defaults[item.target.id] = ast.literal_eval(item.value)
                if item.target.id == "rollout_importance_sampling_mode":
                    annotation = eval(compile(ast.Expression(item.annotation), path, "eval"),
                                      {"Optional": typing.Optional, "Literal": typing.Literal})
                    choices = typing.get_args(typing.get_args(annotation)[0])
    if set(defaults) != {*FIELDS, MICRO}:
        raise SystemExit(f"defaults not found: {defaults}")
    return namespace, defaults, choices, {"ms_swift_version": version, "methods": provenance,
                                          "wheel_sha256": hashlib.sha256(wheel.read_bytes()).hexdigest()}


def _parse_mode(choices: tuple, mode) -> str | None:
    """HfArgumentParser's check of a Literal field: argparse choices. Returns argparse's message, or None."""
    if mode is None:
        return None
    parser = argparse.ArgumentParser(prog="swift rlhf", exit_on_error=False)
    parser.add_argument("--rollout_importance_sampling_mode", choices=choices, default=None)
    try:
        with contextlib.redirect_stderr(io.StringIO()):
            parser.parse_args(["--rollout_importance_sampling_mode", mode])
    except argparse.ArgumentError as error:
        return str(error).split(" (choose from")[0].split(": ", 1)[1]  # without argparse's "argument --NAME: "
    return None


def _trainer(swift: dict, mode, threshold):
    self = types.SimpleNamespace(rollout_importance_sampling_mode=mode,
                                 rollout_importance_sampling_threshold=threshold)
    for name in METHODS:
        setattr(self, name, types.MethodType(swift[name], self))
    return self


def _outputs(swift: dict, defaults: dict, choices: tuple, settings: dict, old, rollout, mask, dtype) -> dict:
    values = {**defaults, **settings}
    mode, threshold = values["rollout_importance_sampling_mode"], values["rollout_importance_sampling_threshold"]
    message = _parse_mode(choices, mode)
    if message:
        return {"error": "ArgumentError", "message": message}
    if mode is None and not values["log_rollout_offpolicy_metrics"]:
        return {"metrics": {}, "micro_batches": {}}  # should_compute_rollout_metrics is False: nothing logged
    self = _trainer(swift, mode, threshold)
    completion_mask = torch.tensor(mask, dtype=torch.bool)
    # What the trainer holds at the padding: rollout zero-filled, its own log-prob finite.
    old_t = torch.where(completion_mask, torch.tensor(old, dtype=dtype), torch.tensor(-1.0, dtype=dtype))
    rollout_t = torch.where(completion_mask, torch.tensor(rollout, dtype=dtype), torch.tensor(0.0, dtype=dtype))
    size = values[MICRO]
    per_micro: dict[str, list] = {}
    try:
        for start in range(0, len(old), size):
            rows = slice(start, start + size)
            o, r, m = old_t[rows], rollout_t[rows], completion_mask[rows]
            metrics = self._compute_rollout_offpolicy_metrics(o, r, m)
            if mode is not None:  # _get_rollout_is_correction
                log_ratio = o - r
                weights = self._apply_rollout_importance_sampling(log_ratio, m)
                metrics.update(self._compute_is_correction_metrics(log_ratio, weights, m))
            # _compute_loss_and_metrics: one rank's row, gathered, nanmean over ranks (max / min for two keys).
            gathered = torch.stack(list(metrics.values())).detach().unsqueeze(0)
            reduced = dict(zip(metrics, gathered.nanmean(0).unbind(), strict=True))
            for key, reduce in (("log_ppl_diff_max", torch.max), ("log_ppl_diff_min", torch.min)):
                reduced[key] = reduce(gathered[:, list(metrics).index(key)])
            for key, value in reduced.items():
                per_micro.setdefault(PREFIX + key, []).append(value)
    except ZeroDivisionError as error:
        return {"error": type(error).__name__, "message": str(error)}
    # log(): each key's list of per-micro-batch tensors, averaged in float64.
    stacked = torch.stack([torch.stack(v) for v in per_micro.values()])
    logged = dict(zip(per_micro, stacked.cpu().double().mean(1).tolist(), strict=True))
    return {"metrics": {k: _encode(float(v)) for k, v in logged.items()},
            "micro_batches": {k: _encode([float(x) for x in v]) for k, v in per_micro.items()}}


def _base(seed: int = 31, lengths=(8, 6, 3, 1, 7, 5), width: int = 8, scale: float = 0.3):
    rng = np.random.default_rng(seed)
    mask = _mask(lengths, width)
    old = rng.uniform(-3.0, -0.05, size=(len(lengths), width))
    rollout = np.minimum(old - rng.normal(0.02, scale, size=old.shape), -0.01)
    rollout = np.where(np.asarray(mask) == 1, rollout, 0.0)
    old = np.where(np.asarray(mask) == 1, old, 0.0)
    return _f32(old), _f32(rollout), mask


MODES = ("token_truncate", "token_mask", "sequence_truncate", "sequence_mask")


def _cases() -> list[dict]:
    cases = []

    def add(name, settings, inputs):
        old, rollout, mask = inputs
        cases.append({"name": name, "settings": settings, "old_log_prob": old, "rollout_log_prob": rollout,
                      "response_mask": mask})

    base = _base()
    add("defaults_off", {}, base)
    add("metrics_only", {"log_rollout_offpolicy_metrics": True}, base)
    for mode in MODES:
        add(f"{mode}_default_threshold", {"rollout_importance_sampling_mode": mode}, base)
        add(f"{mode}_threshold_1_2", {"rollout_importance_sampling_mode": mode,
                                      "rollout_importance_sampling_threshold": 1.2}, base)
    # A threshold below 1: the ESS clamp's lower bound 1/threshold lies above its upper bound.
    add("token_mask_threshold_0_8", {"rollout_importance_sampling_mode": "token_mask",
                                     "rollout_importance_sampling_threshold": 0.8}, base)
    add("sequence_truncate_threshold_0_9", {"rollout_importance_sampling_mode": "sequence_truncate",
                                            "rollout_importance_sampling_threshold": 0.9}, base)
    for size in (2, 4, 16):  # 4: a short last micro-batch; 16: one micro-batch holds every row
        add(f"micro_batch_{size}_metrics_only", {"log_rollout_offpolicy_metrics": True, MICRO: size}, base)
        add(f"micro_batch_{size}_token_truncate", {"rollout_importance_sampling_mode": "token_truncate",
                                                   "rollout_importance_sampling_threshold": 1.2, MICRO: size}, base)
        add(f"micro_batch_{size}_sequence_mask", {"rollout_importance_sampling_mode": "sequence_mask",
                                                  "rollout_importance_sampling_threshold": 1.1, MICRO: size}, base)

    # An empty row among valid ones (it counts in every per-row mean, max and min); then no valid token at all.
    old, rollout, _ = _base(seed=5)
    empty_row = (old, rollout, _mask((8, 5, 0, 2, 8, 1), 8))
    all_empty = (old, rollout, _mask((0,) * 6, 8))
    for name, settings in (("metrics_only", {"log_rollout_offpolicy_metrics": True}),
                           ("token_mask", {"rollout_importance_sampling_mode": "token_mask"}),
                           ("sequence_truncate", {"rollout_importance_sampling_mode": "sequence_truncate",
                                                  "rollout_importance_sampling_threshold": 1.1})):
        add(f"empty_row_{name}", settings, empty_row)
        add(f"empty_row_{name}_micro_batch_3", {**settings, MICRO: 3}, empty_row)
        add(f"all_empty_{name}", settings, all_empty)

    # Rows of one token.
    single = (_f32([[-1.0], [-0.5], [-2.0]]), _f32([[-1.2], [-0.5], [-1.0]]), [[1], [1], [1]])
    add("one_token_rows_token_truncate", {"rollout_importance_sampling_mode": "token_truncate"}, single)
    add("one_token_rows_sequence_mask_micro_batch_3", {"rollout_importance_sampling_mode": "sequence_mask", MICRO: 3},
        single)

    # Catastrophic tokens: |d| = 25 (clamped to 20 before exp, not in kl) and |d| = 40.
    old, rollout, mask = _base(seed=7)
    rollout[0][2] = old[0][2] - 25.0
    rollout[1][1] = old[1][1] + 25.0
    rollout[2][0] = old[2][0] - 40.0
    catastrophic = (old, rollout, mask)
    for mode in MODES:
        add(f"catastrophic_{mode}", {"rollout_importance_sampling_mode": mode}, catastrophic)
    add("catastrophic_sequence_mask_micro_batch_2", {"rollout_importance_sampling_mode": "sequence_mask", MICRO: 2},
        catastrophic)

    # Long rows: a row's mean log-ratio stays small, but training / rollout perplexities grow large; a row of
    # log-probs near -100 makes exp(-mean log-prob) overflow float32 (ppl = inf) while float64 holds it.
    width = 64
    long_rows = ([[-1.0] * width, [-1.0] * width, [-95.0] * width, [-1.0] * width],
                 [[-1.5] * width, [-0.5] * width, [-90.0] * width, [-1.0] * width], _mask((64, 64, 64, 10), width))
    for name, settings in (("metrics_only", {"log_rollout_offpolicy_metrics": True}),
                           ("sequence_truncate", {"rollout_importance_sampling_mode": "sequence_truncate"}),
                           ("token_mask", {"rollout_importance_sampling_mode": "token_mask"})):
        add(f"long_rows_{name}", settings, long_rows)

    # NaN / inf log-probs on valid tokens: a NaN old log-prob, a -inf rollout log-prob (d = +inf).
    old, rollout, mask = _base(seed=11)
    old[0][3] = float("nan")
    nan_token = ([r[:] for r in old], [r[:] for r in rollout], mask)
    old, rollout, mask = _base(seed=11)
    rollout[2][1] = float("-inf")
    inf_token = (old, rollout, mask)
    old, rollout, mask = _base(seed=11)
    old[2][5], rollout[3][4], rollout[5][6] = float("nan"), float("inf"), float("-inf")  # all in the padding
    nan_padding = (old, rollout, mask)
    for name, settings in (("metrics_only", {"log_rollout_offpolicy_metrics": True}),
                           ("token_mask", {"rollout_importance_sampling_mode": "token_mask"}),
                           ("token_truncate_micro_batch_2", {"rollout_importance_sampling_mode": "token_truncate",
                                                             MICRO: 2}),
                           ("sequence_mask_micro_batch_2", {"rollout_importance_sampling_mode": "sequence_mask",
                                                            MICRO: 2})):
        add(f"nan_token_{name}", settings, nan_token)
        add(f"inf_token_{name}", settings, inf_token)
        add(f"nan_padding_{name}", settings, nan_padding)

    # Ratios exactly on the threshold: `<=` keeps them, `>` does not count them (exp(0) = 1 exactly).
    on_bound = ([[-1.0, -2.0, -0.5], [-0.25, -1.5, 0.0]], [[-1.0, -2.0, -0.5], [-0.25, -1.5, 0.0]], _mask((3, 2), 3))
    for mode in MODES:
        add(f"on_bound_{mode}", {"rollout_importance_sampling_mode": mode,
                                 "rollout_importance_sampling_threshold": 1.0}, on_bound)

    # Settings ms-swift refuses: a mode outside the Literal (the argument parser), a zero threshold (1 / threshold
    # in _compute_is_correction_metrics).
    add("ERR_unknown_mode", {"rollout_importance_sampling_mode": "token"}, base)
    add("ERR_zero_threshold", {"rollout_importance_sampling_mode": "token_truncate",
                               "rollout_importance_sampling_threshold": 0.0}, base)
    return cases


def main(wheel: str, out: str) -> None:
    swift, defaults, choices, provenance = _load(Path(wheel))
    cases = _cases()
    for case in cases:
        inputs = (case["old_log_prob"], case["rollout_log_prob"], case["response_mask"])
        for label, dtype in DTYPES.items():
            case[label] = _outputs(swift, defaults, choices, case["settings"], *inputs, dtype)
        case["old_log_prob"] = _encode(case["old_log_prob"])
        case["rollout_log_prob"] = _encode(case["rollout_log_prob"])
    document = {
        **provenance,
        "torch_version": torch.__version__,
        "settings_classes": "swift.rlhf_trainers.args_mixin.GRPOArgumentsMixin (+ swift.trainers.arguments."
                            "TrainArgumentsMixin.per_device_train_batch_size)",
        "mode_choices": list(choices),
        "defaults": defaults,
        "cases": cases,
    }
    write_cases(document, out)
    print(f"{len(cases)} cases -> {out}")


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2] if len(sys.argv) > 2 else "tests/data/ms_swift_parity_cases.json")
