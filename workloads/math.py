"""Math problem sets (AIME 2024, AMC 2023, MATH-500) read from local JSONL files.

Each line is one JSON object with at least ``problem`` (str) and ``answer`` (str or number). The
files live outside the repository (default ``$TTC_DATA_DIR/math/<set>/test.jsonl``, with
``TTC_DATA_DIR`` defaulting to ``../shared/data``); they are never copied here.

Without a tokenizer (random weights) prompts are turned into token ids by :func:`stand_in_tokens`:
the text is split into word / number / symbol pieces (about one BPE token each) and every piece is
hashed to an id of the generator's vocabulary, so the prompt length follows the problem's length.
"""

from __future__ import annotations

import functools
import hashlib
import json
import re
from dataclasses import dataclass
from pathlib import Path
from typing import List, Optional, Tuple

from harness.errors import ConfigError

# search-and-learn system prompt (FastTTS §1.3)
SYSTEM_PROMPT = (
    "Solve the following math problem efficiently and clearly:\n\n"
    "- For simple problems (2 steps or fewer):\nProvide a concise solution with minimal explanation.\n\n"
    "- For complex problems (3 steps or more):\nUse this step-by-step format:\n\n"
    "## Step 1: [Concise description]\n[Brief explanation and calculations]\n\n"
    "## Step 2: [Concise description]\n[Brief explanation and calculations]\n\n...\n\n"
    "Regardless of the approach, always conclude with:\n\n"
    "Therefore, the final answer is: $\\boxed{answer}$. I hope it is correct.\n\n"
    "Where [answer] is just the final number or expression that solves the problem."
)


@dataclass(frozen=True)
class Problem:
    """One problem: ``index`` (0-based, in file order), ``text``, reference ``answer`` (as a
    string), ``line`` (1-based line of the file it was read from)."""

    index: int
    text: str
    answer: str
    line: int = 0


def load_problems(path: str | Path, limit: Optional[int] = None) -> List[Problem]:
    """Read a JSONL problem set.

    Args:
        path: the JSONL file. limit: keep the first ``limit`` problems (None = all).
    Returns: the problems in file order.
    Raises: ConfigError if the file does not exist, a line is not valid JSON or lacks
        ``problem``/``answer`` (the message names the file and the 1-based line number), or the
        file holds no problem.
    """
    p = Path(path)
    if p.is_dir():
        found = ", ".join(sorted(x.name for x in p.glob("*.jsonl"))[:5]) or "none"
        raise ConfigError(
            f"workload.path={str(path)!r} is not allowed: a folder, not a dataset file (its .jsonl "
            f"files: {found}; pass workload.path={p / 'test.jsonl'} or the like)"
        )
    if not p.exists():
        from workloads.data import missing_hint

        raise ConfigError(
            f"workload.path={str(path)!r} is not allowed: no such dataset file "
            f"(pass workload.path=/path/to/test.jsonl, or {missing_hint()})"
        )
    from harness.inputs import read_text

    content = read_text(p, "workload.path", "a JSONL problem set")  # a regular UTF-8 file
    out: List[Problem] = []
    for lineno, line in enumerate(content.replace("\r\n", "\n").split("\n"), start=1):
        if not line.strip():
            continue
        try:
            obj = json.loads(line)
        except json.JSONDecodeError as e:
            raise ConfigError(f"{p}: line {lineno} is not valid JSON ({e.msg} at column {e.colno})") from None
        if not isinstance(obj, dict):
            raise ConfigError(f"{p}: line {lineno} is not a JSON object")
        text = obj.get("problem", obj.get("question"))
        if not isinstance(text, str) or "answer" not in obj:
            raise ConfigError(f"{p}: line {lineno} lacks a 'problem' string or an 'answer' field")
        if not text.strip() or obj["answer"] is None or not str(obj["answer"]).strip():
            raise ConfigError(
                f"{p}: line {lineno} has an empty 'problem' or a null/empty 'answer' (every "
                f"problem needs its text and a reference answer to grade against)"
            )
        out.append(Problem(len(out), text, str(obj["answer"]), lineno))
        if limit is not None and len(out) >= limit:
            break
    if not out:
        raise ConfigError(f"{p}: no problems in the file")
    return out


_PIECE = re.compile(r"[A-Za-z]+|\d|[^\sA-Za-z\d]|\s+")


def stand_in_tokens(text: str, vocab_size: int, reserved: int = 1000) -> List[int]:
    """Token ids for ``text`` without a tokenizer: each regex piece (letters run, digit, symbol,
    whitespace run) hashed (blake2b) to an id in ``[reserved, vocab_size - reserved)``, so the ids
    avoid the low ids (the step delimiter) and the special tokens at the top of the vocabulary.
    Deterministic across processes. Returns a new list of ints (about one per BPE token); a text's
    ids are hashed once per process (a FastTTS run builds every prompt when its input is checked
    and again when it runs)."""
    return list(_stand_in_ids(text, vocab_size, reserved))


@functools.lru_cache(maxsize=4096)
def _stand_in_ids(text: str, vocab_size: int, reserved: int) -> Tuple[int, ...]:
    span = vocab_size - 2 * reserved
    if span <= 0:
        raise ValueError(f"vocab_size {vocab_size} too small for the stand-in tokenizer")
    return tuple(
        reserved + int.from_bytes(hashlib.blake2b(piece.encode(), digest_size=8).digest(), "little") % span
        for piece in _PIECE.findall(text)
    )


def prompt_tokens(problem: Problem, vocab_size: int, tokenizer=None) -> List[int]:
    """The generator prompt (system prompt + question) as token ids.

    With a real tokenizer: its chat template (system + user message, generation prompt added) when
    it has one, else the plain text ``SYSTEM_PROMPT + "\\n\\n" + question + "\\n\\n"``; without a
    tokenizer (random weights), :func:`stand_in_tokens` of the text."""
    if tokenizer is not None:
        if getattr(tokenizer, "chat_template", None):
            msgs = [{"role": "system", "content": SYSTEM_PROMPT}, {"role": "user", "content": problem.text}]
            out = tokenizer.apply_chat_template(msgs, add_generation_prompt=True, tokenize=True)
            ids = out["input_ids"] if hasattr(out, "keys") else out  # BatchEncoding in transformers 5
            return [int(t) for t in ids]
        return list(tokenizer.encode(SYSTEM_PROMPT + "\n\n" + problem.text + "\n\n", add_special_tokens=False))
    return stand_in_tokens(SYSTEM_PROMPT + "\n" + problem.text, vocab_size)
