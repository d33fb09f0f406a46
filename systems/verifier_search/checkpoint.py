"""Local checkpoints for the tts family (``model.weights=/dir``, ``verifier.weights=/dir``).

A checkpoint is a HuggingFace directory: ``config.json``, ``*.safetensors`` weights and tokenizer
files. :func:`inspect` checks one before any work (ConfigError naming the field, what was wrong and
what is allowed); :class:`TokenSpace` is the generator's view of its tokenizer (step delimiters,
end tokens, prompt, decoding); :class:`VerifierText` builds a real PRM's input from decoded steps.

Step boundaries follow search-and-learn's stop string "\\n\\n" at token level: every vocabulary
token whose text contains "\\n\\n" ends a step (Qwen2: "\\n\\n" = 271, ".\\n\\n", ":\\n\\n", ...).
A "\\n\\n" split over two tokens ("\\n" + "\\n") is not a boundary. The verifier's step tag is the
single token its tokenizer encodes "\\n\\n" to (Skywork PRM: the score of a step is read there).
A Math-Shepherd-style verifier (``verifier.prm_kind=lm``, a causal LM) instead reads its own step
tag (" ки") inserted after every step (:class:`ShepherdText`).
"""

from __future__ import annotations

import json
from functools import lru_cache
from pathlib import Path
from typing import Dict, List, Optional, Sequence, Tuple

from harness.errors import ConfigError

DELIMITER = "\n\n"
TOKENIZER_FILES = ("tokenizer.json", "tokenizer.model", "vocab.json", "tokenizer_config.json")
# config.json key -> model-config field (shape check)
SHAPE_KEYS = (
    ("model_type", "hf_model_type"),
    ("num_hidden_layers", "num_layers"),
    ("hidden_size", "hidden_size"),
    ("num_attention_heads", "num_heads"),
    ("num_key_value_heads", "num_kv_heads"),
    ("head_dim", "head_dim"),
    ("intermediate_size", "intermediate_size"),
    ("vocab_size", "vocab_size"),
)
# what the real vLLM path runs (vllm_engine.py)
GENERATOR_SUFFIX = "ForCausalLM"
VERIFIER_ARCHITECTURES = ("Qwen2ForProcessRewardModel",)  # verifier.prm_kind=head; lm: *ForCausalLM


def is_local(weights) -> bool:
    return str(weights) != "random"


@lru_cache(maxsize=8)
def load_tokenizer(path: str):
    """The checkpoint's tokenizer (transformers ``AutoTokenizer``, local files only)."""
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(path, local_files_only=True)


def inspect(field: str, model_cfg, role: str, real_engine: bool = True) -> dict:
    """Check the checkpoint directory named by ``{field}.weights``; returns its config.json dict.

    ``role``: generator | verifier. Raises ConfigError when the directory does not exist, has no
    config.json / safetensors weights / loadable tokenizer, its architecture class is not one the
    real path runs (generator: ``*ForCausalLM``; verifier, when ``real_engine``:
    ``Qwen2ForProcessRewardModel``, or ``*ForCausalLM`` when ``prm_kind=lm``), or its
    shapes differ from the chosen config ``{field}={name}`` (every differing key is listed)."""
    from harness.model_facts import check_weights

    check_weights(model_cfg, field)  # the rule every real engine shares: a folder, a valid config.json, weights
    path = Path(str(model_cfg.weights)).expanduser()
    where = f"{field}.weights={str(model_cfg.weights)!r}"
    allowed = "random, or a local HuggingFace checkpoint directory (config.json, *.safetensors, tokenizer files)"
    hf = json.loads((path / "config.json").read_text())
    if not any(path.glob("*.safetensors")):
        raise ConfigError(f"{where} is not allowed: no *.safetensors weights in the directory; allowed: {allowed}")
    if not any((path / f).is_file() for f in TOKENIZER_FILES):
        raise ConfigError(
            f"{where} is not allowed: the directory has no tokenizer (none of "
            f"{', '.join(TOKENIZER_FILES)}); save one next to the weights "
            f"(tokenizer.save_pretrained(dir))"
        )
    try:
        tok = load_tokenizer(str(path))
    except Exception as e:  # noqa: BLE001 - any loader failure is a config error
        raise ConfigError(f"{where}: its tokenizer does not load ({type(e).__name__}: {e})") from None
    arch = (hf.get("architectures") or ["?"])[0]
    if role == "generator" and not arch.endswith(GENERATOR_SUFFIX):
        raise ConfigError(
            f"{where} is not allowed: architecture {arch} is not a causal LM; the generator "
            f"needs a *{GENERATOR_SUFFIX} checkpoint"
        )
    if role == "verifier" and real_engine and model_cfg.prm_kind == "lm" and not arch.endswith(GENERATOR_SUFFIX):
        raise ConfigError(
            f"{where} is not allowed: architecture {arch} is not a causal LM; verifier="
            f"{model_cfg.name} (prm_kind=lm) reads the logits of good_token_id/bad_token_id at its "
            f"step tag, so it needs a *{GENERATOR_SUFFIX} checkpoint (e.g. MistralForCausalLM)"
        )
    if role == "verifier" and real_engine and model_cfg.prm_kind != "lm" and arch not in VERIFIER_ARCHITECTURES:
        raise ConfigError(
            f"{where} is not allowed: architecture {arch} is not a PRM the real vLLM path runs; "
            f"allowed: {', '.join(VERIFIER_ARCHITECTURES)} (2-label head, scored on vLLM's pooling "
            f"path; Skywork's Qwen2ForPrmModel value-head checkpoints need their vLLM plugin)"
        )
    diffs = []
    for key, fld in SHAPE_KEYS:
        want, have = model_cfg[fld], hf.get(key)
        if key == "head_dim" and have is None and hf.get("hidden_size") and hf.get("num_attention_heads"):
            have = hf["hidden_size"] // hf["num_attention_heads"]
        if have != want:
            diffs.append((key, have, fld, want))
    if diffs:
        listed = "; ".join(
            f"{k}={h!r} in the checkpoint, {f}={w!r} in {field}={model_cfg.name}" for k, h, f, w in diffs
        )
        fix = " ".join(f"{field}.{f}={h}" for k, h, f, w in diffs)
        raise ConfigError(
            f"{where}: the checkpoint's architecture differs from {field}={model_cfg.name}: {listed}. "
            f"Pick the {field} config that describes this checkpoint or override the fields ({fix})"
        )
    if len(tok) > int(hf["vocab_size"]):
        raise ConfigError(
            f"{where}: its tokenizer has {len(tok)} tokens, more than the model's vocab_size {hf['vocab_size']}"
        )
    return hf


def delimiter_ids(tok) -> Tuple[int, ...]:
    """Ids of every non-special token whose text contains "\\n\\n" (sorted)."""
    special = set(tok.all_special_ids)
    texts = tok.batch_decode([[i] for i in range(len(tok))])
    return tuple(i for i, t in enumerate(texts) if DELIMITER in t and i not in special)


def end_ids(tok, path: str) -> Tuple[int, ...]:
    """The tokenizer's EOS plus ``generation_config.json``'s ``eos_token_id`` (int or list), sorted."""
    ids = set() if tok.eos_token_id is None else {int(tok.eos_token_id)}
    gc = Path(path) / "generation_config.json"
    if gc.is_file():
        e = json.loads(gc.read_text()).get("eos_token_id")
        ids.update(int(x) for x in (e if isinstance(e, list) else [e] if e is not None else []))
    return tuple(sorted(ids))


def step_tag_id(tok) -> Optional[int]:
    """The single token the tokenizer encodes "\\n\\n" to, or None when it takes several."""
    ids = tok.encode(DELIMITER, add_special_tokens=False)
    return ids[0] if len(ids) == 1 else None


def check_tokenizers(cfg) -> None:
    """Step-tag compatibility of the local tokenizers (generator: "\\n\\n" tokens and an end token;
    verifier: "\\n\\n" is one token, or with ``prm_kind=lm`` :func:`check_lm_tokens`). Raises ConfigError."""
    m, v = cfg.model, cfg.verifier
    if is_local(m.weights):
        space = token_space(str(m.weights))
        if not space.delimiters:
            raise ConfigError(
                f'model.weights={str(m.weights)!r}: its tokenizer has no token containing "\\n\\n", '
                f"the step delimiter (search-and-learn stop string); allowed: a tokenizer with one"
            )
        if not space.ends:
            raise ConfigError(
                f"model.weights={str(m.weights)!r}: its tokenizer defines no EOS token, so paths "
                f"cannot end; set eos_token in the tokenizer or generation_config.json"
            )
    if is_local(v.weights):
        tok = load_tokenizer(str(Path(str(v.weights)).expanduser()))
        if v.prm_kind == "lm":
            check_lm_tokens(tok, v)
        elif step_tag_id(tok) is None:
            raise ConfigError(
                f'verifier.weights={str(v.weights)!r}: its tokenizer encodes "\\n\\n" as '
                f"{tok.encode(DELIMITER, add_special_tokens=False)}, not one token, so it has no step "
                f'tag for the generator\'s step delimiter; allowed: a PRM whose step tag is "\\n\\n"'
            )


def verifier_prompt(tok, problem_text: str) -> List[int]:
    """A PRM's prompt ids: BOS (if the tokenizer has one) + problem + "\n" (Skywork, FastTTS §1.3)."""
    return tok.encode((tok.bos_token or "") + problem_text + "\n", add_special_tokens=False)


@lru_cache(maxsize=4)
def token_space(path: str) -> "TokenSpace":
    """The (cached) :class:`TokenSpace` of a local generator checkpoint."""
    return TokenSpace(path)


class TokenSpace:
    """A local generator checkpoint's tokenizer: step delimiters, end tokens, prompts and text."""

    def __init__(self, path: str):
        self.path = str(Path(path).expanduser())
        self.tok = load_tokenizer(self.path)
        self.delimiters = delimiter_ids(self.tok)
        self.ends = end_ids(self.tok, self.path)

    def decode(self, ids: Sequence[int]) -> str:
        return self.tok.decode(list(ids), skip_special_tokens=True)


class VerifierText:
    """Real PRM input from real text (Skywork ``prepare_input``, FastTTS §1.3): the prompt is
    BOS + problem + "\\n"; a step's text is split on "\\n\\n" and every piece is encoded by the
    verifier's tokenizer and followed by the step tag (a trailing empty piece, after the step's own
    "\\n\\n", is dropped). A step's score is read at its last tag (the last iteration decodes
    without stopping, so its step may hold several pieces: its score is the last one's, as with
    ``agg_strategy=last``). Steps are encoded one by one, so a path's input extends its parent's
    (the verifier's prefix cache hits)."""

    insert = True  # a tag follows every step (what the simulated verifier charges)

    def __init__(self, gen: TokenSpace, verifier_path: str):
        self.gen = gen
        self.tok = load_tokenizer(str(Path(verifier_path).expanduser()))
        self.tag = step_tag_id(self.tok)
        self._steps: Dict[Tuple[int, ...], List[int]] = {}

    def prompt(self, problem_text: str) -> List[int]:
        return verifier_prompt(self.tok, problem_text)

    def _step(self, toks: Tuple[int, ...]) -> List[int]:
        ids = self._steps.get(toks)
        if ids is None:
            pieces = self.gen.decode(toks).split(DELIMITER)
            if len(pieces) > 1 and pieces[-1] == "":
                pieces.pop()
            ids = [i for p in pieces for i in self.tok.encode(p, add_special_tokens=False) + [self.tag]]
            self._steps[toks] = ids
        return ids

    def build(self, prompt: List[int], tokens: List[int], step_ends: List[int]):
        """Returns (verifier ids, position of each step's tag)."""
        ids, pos, start = list(prompt), [], 0
        for end in step_ends:
            ids.extend(self._step(tuple(tokens[start:end])))
            pos.append(len(ids) - 1)
            start = end
        return ids, pos


def tagged_ids(tok, text: str, tag_ends: Sequence[int], tag_id: int) -> Tuple[List[int], List[int]]:
    """Encode ``text`` (with the tokenizer's special tokens, e.g. BOS) and find the step tags that end
    at the character offsets ``tag_ends``. Returns (ids, position of each tag's token).

    Raises ValueError when a tag is not one token of id ``tag_id`` (split in several tokens, merged
    with a neighbour, or another id); the message lists the tokens found there."""
    enc = tok(text, add_special_tokens=True, return_offsets_mapping=True)
    ids, offs = list(enc["input_ids"]), enc["offset_mapping"]
    end_at = {e: i for i, (b, e) in enumerate(offs) if e > b}  # last token ending at each offset
    pos = []
    for end in tag_ends:
        i = end_at.get(end)
        if i is None or ids[i] != tag_id:
            near = [(tok.decode([t]), t) for t, (b, e) in zip(ids, offs) if e > end - 4 and b < end + 2]
            raise ValueError(
                f"the step tag ending at character {end} is not the single token {tag_id}; tokens there: {near}"
            )
        pos.append(i)
    return ids, pos


def check_lm_tokens(tok, v) -> None:
    """A ``prm_kind=lm`` verifier's tokenizer against its config: ``step_tag`` after a step's text
    is the single token ``step_tag_id`` (checked on a formatted two-step input), and
    ``good_token_id`` / ``bad_token_id`` are single tokens whose text is "+" / "-" (leading space
    or "▁" ignored). Raises ConfigError naming the field, what the tokenizer gives and what is allowed."""
    where = f"verifier.weights={str(v.weights)!r}"
    text, ends = ShepherdText.format("What is 1 + 1?", ["We add 1 and 1.\n\n", "The answer is 2."], v.step_tag)
    try:
        tagged_ids(tok, text, ends, int(v.step_tag_id))
    except ValueError as e:
        alone = tok.encode(v.step_tag, add_special_tokens=False)
        allowed = (
            f"verifier.step_tag_id={alone[0]}"
            if len(alone) == 1
            else "a tokenizer that encodes the step tag as one token after a step's text"
        )
        raise ConfigError(
            f"verifier.step_tag_id={v.step_tag_id} is not allowed with {where}: {e} (verifier.step_tag="
            f"{v.step_tag!r} alone encodes to {alone}); allowed: {allowed}"
        ) from None
    except NotImplementedError:
        raise ConfigError(
            f"{where}: its tokenizer gives no character offsets (a slow tokenizer); allowed: a fast "
            f"tokenizer (tokenizer.json)"
        ) from None
    texts = tok.batch_decode([[i] for i in range(len(tok))])
    for fld, want in (("good_token_id", "+"), ("bad_token_id", "-")):
        have = v[fld]
        if have is None or not 0 <= int(have) < len(tok) or texts[int(have)].strip().lstrip("▁") != want:
            shown = "no token" if have is None or not 0 <= int(have) < len(tok) else repr(texts[int(have)])
            allowed = [i for i, t in enumerate(texts) if t.strip().lstrip("▁") == want]
            raise ConfigError(
                f"verifier.{fld}={have} is not allowed with {where}: it is {shown} in its tokenizer, "
                f"not the single token {want!r}; allowed: {allowed}"
            )


class ShepherdText(VerifierText):
    """Math-Shepherd PRM input from real text (``prm_kind=lm``; peiyi9979/math-shepherd-mistral-7b-prm
    model card: ``f"{question} {output}"`` where every step of ``output`` ends with " ки"; the
    step-tag handling of search-and-learn / the FastTTS AE, §1.3): the text is question + " " +
    the steps, where every "\\n\\n" of a step's text becomes " ки\\n\\n" and a step not ending in
    "\\n\\n" (end token, length cap) gets " ки" appended. The model card's bare question, or with
    ``preamble`` (``verifier.system_prompt``, the default) the AE's system prompt + "\\n" + question + "\\n". The whole text is encoded at once (with BOS),
    as the model card does, and each tag's token is located by character offsets
    (:func:`tagged_ids`); a step's score is read at its last tag (``agg_strategy=last`` for a last
    step holding several "\\n\\n" pieces). A path's ids extend its parent's, so the verifier's prefix
    cache hits."""

    def __init__(self, gen: TokenSpace, verifier_path: str, step_tag: str, step_tag_id: int, preamble: str = ""):
        super().__init__(gen, verifier_path)
        self.tag, self.tag_text = int(step_tag_id), step_tag
        self.preamble = preamble  # the FastTTS artifact's: its system prompt (verifier.system_prompt)
        self._questions: Dict[Tuple[int, ...], str] = {}
        self._texts: Dict[Tuple[int, ...], str] = {}  # step tokens -> decoded text

    @staticmethod
    def format(question: str, steps: Sequence[str], tag: str) -> Tuple[str, List[int]]:
        """(text, character offset where each step's last tag ends)."""
        text, ends = question + " ", []
        for step in steps:
            pieces = step.split(DELIMITER)
            trailing = len(pieces) > 1 and pieces[-1] == ""  # the step's own closing "\n\n"
            if trailing:
                pieces.pop()
            for k, piece in enumerate(pieces):
                text += piece + tag
                last = len(text)
                if k < len(pieces) - 1 or trailing:
                    text += DELIMITER
            ends.append(last)
        return text, ends

    def prompt(self, problem_text: str) -> List[int]:
        """The question's ids (for prompt lengths); :meth:`build` encodes the question's text. With a
        ``preamble`` the question is preamble + "\\n" + question + "\\n" (the FastTTS artifact's
        ``_score_outputs_math_shepherd``: ``f"{system_prompt}\\n{question}\\n {output}"``)."""
        if self.preamble:
            problem_text = self.preamble + "\n" + problem_text + "\n"
        ids = list(self.tok(problem_text + " ", add_special_tokens=True)["input_ids"])
        self._questions[tuple(ids)] = problem_text
        return ids

    def build(self, prompt: List[int], tokens: List[int], step_ends: List[int]):
        """Returns (verifier ids, position of each step's last tag). Raises RuntimeError when the
        tokenizer merges a tag with its neighbours in this text (validation checks a plain case)."""
        steps, start = [], 0
        for end in step_ends:
            key = tuple(tokens[start:end])
            if key not in self._texts:
                self._texts[key] = self.gen.decode(key)
            steps.append(self._texts[key])
            start = end
        text, ends = self.format(self._questions[tuple(prompt)], steps, self.tag_text)
        try:
            return tagged_ids(self.tok, text, ends, self.tag)
        except ValueError as e:
            raise RuntimeError(f"Math-Shepherd verifier input: {e}") from None
