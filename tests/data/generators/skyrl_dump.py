"""SkyRL `trainer.dump_data_batch` files, written by SkyRL's own `TrainingInputBatch.save`.

Run by hand, never by CI or the tests. SkyRL 0.4.0 needs Python >= 3.12 to install and pulls in ray, vllm and
more, so the wheel is unpacked into a folder and only the modules that build and save a batch are imported:

    python3 -m venv SCRATCH/venv && SCRATCH/venv/bin/pip install torch==2.13.0 numpy   # the CPU wheel
    SCRATCH/venv/bin/pip download skyrl==0.4.0 --no-deps --python-version 3.12 --only-binary=:all: -d SCRATCH
    mkdir SCRATCH/src && cd SCRATCH/src && unzip ../skyrl-0.4.0-py3-none-any.whl && cd -
    SCRATCH/venv/bin/python tests/data/generators/skyrl_dump.py SCRATCH/src tests/data/skyrl_dump

What runs is SkyRL's: `convert_prompts_responses_to_batch_tensors` (skyrl/train/dataset/preprocess.py) lays the
responses out right-aligned in [B, T] tensors as `RayPPOTrainer.convert_to_training_input` does,
`TrainingInputBatch` and `pad_training_input_batch` (skyrl/backends/skyrl_train/training_batch.py) hold and pad
the batch, and `TrainingInputBatch.save` pickles it, as `RayPPOTrainer.dump_data` does with
`trainer.dump_data_batch=true`. The steps between (the policy forward giving `action_log_probs`, the advantage
estimator) need a model, so their outputs are filled in here with known values, and the keys are set and popped
in the trainer's order (skyrl/train/trainer.py, `train` loop steps 3 to 6). Stubbed: the `jaxtyping` annotations
and `loguru`'s logger (neither is used on this path), and the `__init__` of packages whose imports pull in
cloudpathlib and the Tinker backends (their submodules are imported directly).

Writes, under OUT:
- dumped_data/global_step_3_training_input.pkl: float32, 5 samples (a multi-turn loss mask with tool tokens at
  0, an all-masked response, a one-token response), padded by one row (`pad_size` 1);
- dumped_data/global_step_4_training_input.pkl: `action_log_probs` in bfloat16 (SkyRL's torch.save fallback
  for dtypes numpy lacks), plus a `rollout_sample_support` PackedTensor (pickled as a numpy array);
- no_policy_forward/global_step_1_training_input.pkl: `action_log_probs` None, as when SkyRL skips the policy
  forward (a loss that never reads old log-probs, with rollout log-probs present);
- expected.json: the per-response values that were fed in (the reader's test compares against these).
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import sys
import types

import numpy as np
import torch

PACKAGES = ("skyrl.backends", "skyrl.backends.skyrl_train.utils", "skyrl.backends.skyrl_train.distributed.megatron",
            "skyrl.train", "skyrl.train.dataset")


def _import_skyrl(root: str):
    sys.path.insert(0, root)
    annotations = types.ModuleType("jaxtyping")

    class _Annotation:
        def __class_getitem__(cls, item):
            return cls

    annotations.Bool = annotations.Float = annotations.Integer = _Annotation
    sys.modules["jaxtyping"] = annotations
    loguru = types.ModuleType("loguru")
    loguru.logger = logging.getLogger("skyrl-stub")
    sys.modules["loguru"] = loguru
    for name in PACKAGES:  # skip these packages' __init__ (heavy imports); their submodules load from the wheel
        package = types.ModuleType(name)
        package.__path__ = [os.path.join(root, *name.split("."))]
        sys.modules[name] = package
    import skyrl
    import skyrl.backends.skyrl_train.training_batch as training_batch
    import skyrl.train.dataset.preprocess as preprocess

    return skyrl.__version__, training_batch, preprocess


def _grid(rng: np.random.Generator, n: int, low: float, high: float) -> list[float]:
    """n values in [low, high) on a 1/64 grid: exact in float32 and in bfloat16 (|v| < 4)."""
    return (np.floor(rng.uniform(low, high, n) * 64) / 64).tolist()


def _samples(seed: int) -> list[dict]:
    rng = np.random.default_rng(seed)
    lengths = [6, 3, 1, 4, 5]
    samples = []
    for i, n in enumerate(lengths):
        rollout = _grid(rng, n, -3.9, -0.02)
        old = [min(v + float(d), -1 / 64) for v, d in zip(rollout, np.floor(rng.normal(0, 0.1, n) * 64) / 64,
                                                          strict=True)]
        mask = [1] * n
        if i == 0:
            mask[2] = mask[3] = 0  # tool output inside a multi-turn response
        if i == 3:
            mask = [0] * n  # a response dropped from the loss (e.g. overlong filtering)
        samples.append({"prompt": int(rng.integers(2, 6)), "old": old, "rollout": rollout, "loss_mask": mask,
                        "advantage": float(np.round(rng.normal(0, 1) * 64) / 64), "uid": f"p{i // 2}"})
    return samples


def _right_aligned(rows: list[list[float]], width: int, fill: float) -> torch.Tensor:
    out = np.full((len(rows), width), fill, dtype=np.float32)
    for i, row in enumerate(rows):
        out[i, width - len(row):] = row
    return torch.from_numpy(out)


def _batch(training_batch, preprocess, samples: list[dict], pad_size: int, *, policy_dtype=torch.float32,
           policy_forward: bool = True, sample_support: bool = False):
    """A batch as RayPPOTrainer holds it when `dump_data` runs (after advantages, before the policy update)."""
    prompts = [[7] * s["prompt"] for s in samples]
    responses = [[11 + j for j in range(len(s["old"]))] for s in samples]
    rewards = [[0.0] * (len(s["old"]) - 1) + [1.0] for s in samples]
    support = ([np.arange(len(s["old"]) * 2, dtype=np.int32).reshape(-1, 2) for s in samples]
               if sample_support else None)
    (sequences, attention_mask, response_mask, rewards_t, loss_mask, rollout_logprobs, expert_indices,
     support_t) = preprocess.convert_prompts_responses_to_batch_tensors(
        0, prompts, responses, rewards, [s["loss_mask"] for s in samples], [s["rollout"] for s in samples],
        None, support)
    fields = {"sequences": sequences, "attention_mask": attention_mask, "response_mask": response_mask,
              "rewards": rewards_t, "loss_mask": loss_mask, "rollout_logprobs": rollout_logprobs,
              "rollout_expert_indices": expert_indices, "router_padding_mask": None,
              "rollout_sample_support": support_t, "pixel_values": None, "image_grid_thw": None}
    batch = training_batch.TrainingInputBatch(fields)
    uids = [s["uid"] for s in samples]
    batch.metadata = {"uids": uids, "policy_mini_batch_boundaries": [(0, len(samples))],
                      "policy_prompt_boundaries": [(0, 2), (2, 4), (4, 5)],
                      "response_length": response_mask.shape[1],
                      "avg_response_length": sum(len(r) for r in responses) / len(responses)}
    batch = training_batch.pad_training_input_batch(batch, pad_size)
    width = response_mask.shape[1]
    rows = [s["old"] for s in samples] + [samples[0]["old"]] * pad_size  # the padding rows copy row 0
    # The policy forward's slice log_probs[:, -num_actions-1:-1] holds prompt-token log-probs left of a short
    # response: not zero, so fill those positions with -0.5 (the reader must trim them by response_mask).
    policy = _right_aligned(rows, width, -0.5).to(policy_dtype) if policy_forward else None
    batch["base_action_log_probs"] = None
    batch["action_log_probs"] = policy
    batch["values"] = None
    advantages = torch.tensor([s["advantage"] for s in samples] + [samples[0]["advantage"]] * pad_size)
    batch["advantages"] = advantages[:, None] * batch["loss_mask"]
    batch["returns"] = batch["advantages"].clone()
    batch.metadata["metrics"] = {"loss/avg_final_rewards": 1.0}
    batch.pop("rewards")
    batch.metadata.pop("uids")
    batch.metadata.pop("is_last_step", None)
    return batch


def main(root: str, out: str) -> None:
    version, training_batch, preprocess = _import_skyrl(root)
    files = {
        "dumped_data/global_step_3_training_input.pkl": (_samples(3), {"pad_size": 1}),
        "dumped_data/global_step_4_training_input.pkl": (_samples(4), {"pad_size": 0, "policy_dtype": torch.bfloat16,
                                                                       "sample_support": True}),
        "no_policy_forward/global_step_1_training_input.pkl": (_samples(1), {"pad_size": 0, "policy_forward": False}),
    }
    expected = {"skyrl": version, "torch": torch.__version__, "writer": "TrainingInputBatch.save (pickle)",
                "files": {}}
    for name, (samples, kwargs) in files.items():
        path = os.path.join(out, name)
        os.makedirs(os.path.dirname(path), exist_ok=True)
        batch = _batch(training_batch, preprocess, samples, **kwargs)
        batch.save(path)
        with open(path, "rb") as handle:
            digest = hashlib.sha256(handle.read()).hexdigest()
        expected["files"][name] = {
            "sha256": digest, "pad_size": kwargs["pad_size"],
            "policy_dtype": str(kwargs.get("policy_dtype", torch.float32)).removeprefix("torch."),
            "action_log_probs": kwargs.get("policy_forward", True),
            "rows": [{k: s[k] for k in ("old", "rollout", "loss_mask", "advantage")} for s in samples],
        }
    with open(os.path.join(out, "expected.json"), "w") as handle:
        json.dump(expected, handle, indent=1)
        handle.write("\n")


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2])
