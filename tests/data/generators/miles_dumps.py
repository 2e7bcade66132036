"""Miles's own debug dumps, written by Miles's own writers, for the reader tests (tests/io/test_io_miles.py).

Run by hand, never by CI or the tests, with the interpreter of a scratch venv that holds torch:

    python3 -m venv SCRATCH/venv && SCRATCH/venv/bin/pip install torch==2.13.0   # the CPU wheel
    SCRATCH/venv/bin/python tests/data/generators/miles_dumps.py MILES_GIT_DIR tests/data/miles_dumps

MILES_GIT_DIR is a clone (bare is fine) of github.com/radixark/miles holding commit 31f1ca96 (COMMIT below). As
for the parity cases (miles_cases.py), the writers are taken out of the files of that commit by their syntax trees
and run unchanged with torch and stubs (the process rank, the parallel state):

* `miles/utils/train_dump_utils.py:save_debug_train_data_for_rank` writes `train_data/{rollout_id}_{rank}.pt`,
  the file `--dump-details DIR` (or `--save-debug-train-data PATH`) makes after each rollout's training; it is given
  the rollout batch as Miles's actor holds it then (`backends/training_utils/data.py:get_rollout_data`: tokens as
  int64 tensors, loss masks as int32 tensors, `rollout_mask_sums` a float32 tensor, rollout log-probs float32;
  the trainer's `log_probs` float32 from its forward pass; plain lists for lengths, rewards and indices). Once with
  one context-parallel rank (`train_data/3_0.pt`), once as rank 0 of two (`train_data_cp2/3_0.pt`): there the
  per-token fields are the rank's zigzag slice, cut by `cp_utils.py:slice_log_prob_with_cp` itself.
* `miles/backends/training_utils/debug_dump.py:maybe_dump_policy_loss_debug` writes
  `policy_loss_debug/rank_{rank}_call_{n}.pt`, one per policy-loss call under `--dump-details`.

The inputs are small and fixed (values multiples of 1/256); `PROVENANCE.json` beside the dumps records the commit,
each function's line range and SHA-256, and the torch version.
"""

from __future__ import annotations

import ast
import hashlib
import json
import logging
import subprocess
import sys
import types
from argparse import Namespace
from pathlib import Path

import torch

COMMIT = "31f1ca961a94cb860cec3b2dea34ec332bfa8f76"
LOADED: list[dict] = []
ROLLOUT_ID = 3


def _show(git_dir: str, path: str) -> str:
    return subprocess.run(["git", "-C", git_dir, "show", f"{COMMIT}:{path}"], check=True, capture_output=True,
                          text=True).stdout


def _load(git_dir: str, path: str, names: list[str], namespace: dict) -> dict:
    source = _show(git_dir, path)
    tree = ast.parse(source, path)
    found = {getattr(node, "name", None) or getattr(getattr(node, "targets", [None])[0], "id", None): node
             for node in tree.body}
    for name in names:
        node = found[name]
        exec(compile(ast.Module(body=[node], type_ignores=[]), path, "exec"), namespace)
        LOADED.append({"file": path, "function": name, "lines": [node.lineno, node.end_lineno],
                       "sha256": hashlib.sha256(ast.get_source_segment(source, node).encode()).hexdigest()})
    return namespace


def _parallel(cp_size: int) -> types.SimpleNamespace:
    return types.SimpleNamespace(cp=types.SimpleNamespace(size=cp_size, rank=0, group=None))


# Four samples: (prompt length, trainer log-probs, rollout log-probs, loss mask), a tool token and an empty one.
SAMPLES = [
    (4, [-0.5, -1.25, -0.0625, -2.0, -0.75, -0.125], [-0.53125, -1.0, -0.0625, -2.5, -0.6875, -0.1171875],
     [1, 1, 1, 0, 1, 1]),
    (3, [-0.25, -3.0, -0.5], [-0.25, -2.75, -0.515625], [1, 1, 1]),
    (5, [-1.5, -0.375], [-1.5, -0.375], [0, 0]),
    (2, [-0.0078125, -4.0, -1.0, -0.5, -0.25], [-0.0078125, -4.5, -1.0078125, -0.5, -0.2578125], [1, 1, 1, 1, 1]),
]


def _rollout_data(slice_cp) -> dict:
    """The rollout batch as Miles's actor holds it when it saves the train dump (one DP shard)."""
    f32 = torch.float32
    lengths = [len(old) for _, old, _, _ in SAMPLES]
    totals = [prompt + n for (prompt, *_), n in zip(SAMPLES, lengths, strict=True)]

    def per_token(index: int) -> list[torch.Tensor]:
        return [torch.as_tensor(slice_cp(s[index], t, n), dtype=f32) for s, t, n in zip(SAMPLES, totals, lengths,
                                                                                         strict=True)]

    return {
        "tokens": [torch.arange(t, dtype=torch.long) + 100 for t in totals],
        "response_lengths": lengths,
        "total_lengths": totals,
        "loss_masks": [torch.tensor(m, dtype=torch.int) for *_, m in SAMPLES],
        "rollout_mask_sums": torch.tensor([float(sum(m)) for *_, m in SAMPLES], dtype=f32),
        "rewards": [1.0, 0.0, 0.0, 1.0],
        "truncated": [0, 0, 1, 0],
        "sample_indices": [10, 11, 12, 13],
        "rollout_ids": [10, 11, 12, 13],
        "rollout_log_probs": per_token(2),
        "log_probs": per_token(1),
        "advantages": [torch.zeros(n, dtype=f32) for n in lengths],
        "returns": [torch.zeros(n, dtype=f32) for n in lengths],
    }


def main(git_dir: str, out: str) -> None:
    folder = Path(out)
    logger = logging.getLogger("miles_dumps")
    cp_file = "miles/backends/training_utils/cp_utils.py"
    for cp_size, name in ((1, "train_data"), (2, "train_data_cp2")):
        state = _parallel(cp_size)
        cp = _load(git_dir, cp_file, ["get_logits_and_tokens_offset_with_cp", "slice_log_prob_with_cp"],
                   {"torch": torch, "get_parallel_state": lambda state=state: state})
        writer = _load(git_dir, "miles/utils/train_dump_utils.py", ["save_debug_train_data_for_rank"],
                       {"torch": torch, "Path": Path, "logger": logger})["save_debug_train_data_for_rank"]
        args = Namespace(save_debug_train_data=f"{folder}/{name}/{{rollout_id}}_{{rank}}.pt", qkv_format="thd")
        writer(args, rollout_id=ROLLOUT_ID, rollout_data=_rollout_data(cp["slice_log_prob_with_cp"]), rank=0,
               cp_rank=0, cp_size=cp_size)
    debug = _load(git_dir, "miles/backends/training_utils/debug_dump.py",
                  ["_POLICY_LOSS_DUMP_COUNTER", "maybe_dump_policy_loss_debug"],
                  {"torch": torch, "Path": Path, "Namespace": Namespace, "RolloutBatch": dict,
                   "dist": types.SimpleNamespace(is_available=lambda: False)})
    data = _rollout_data(lambda values, total, length: values)
    d = torch.cat(data["log_probs"]) - torch.cat(data["log_probs"])  # ppo_kl on the first optimizer step: 0
    debug["maybe_dump_policy_loss_debug"](
        args=Namespace(dump_details=str(folder)), batch=data, train_log_probs=data["log_probs"],
        old_log_probs=data["log_probs"], rollout_log_probs=data["rollout_log_probs"],
        advantages=data["advantages"], local_loss_masks=data["loss_masks"], ppo_kl=d, pg_loss=torch.zeros_like(d))
    provenance = {"miles_commit": COMMIT, "torch_version": torch.__version__, "source": LOADED,
                  "files": sorted(str(p.relative_to(folder)) for p in folder.rglob("*.pt"))}
    (folder / "PROVENANCE.json").write_text(json.dumps(provenance, indent=1) + "\n")
    print("\n".join(provenance["files"]))


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2] if len(sys.argv) > 2 else "tests/data/miles_dumps")
