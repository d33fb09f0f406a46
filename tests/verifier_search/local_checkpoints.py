"""Tiny local checkpoints for tests, built without downloads: a byte-level BPE tokenizer trained
(``tokenizers``) on the shared math problem texts with Qwen2's pre-tokenizer pattern (so "\\n\\n" and
".\\n\\n"-style tokens exist), wrapped as ``PreTrainedTokenizerFast`` with a ChatML template; a
tiny-qwen2-shaped ``Qwen2ForCausalLM`` (random init) and a ``Qwen2ForProcessRewardModel`` PRM
(transformers ``Qwen2Model`` + vLLM's 2-layer score head), saved as safetensors; and a Math-Shepherd-
style verifier: a tiny ``MistralForCausalLM`` with its own tokenizer (trained the same way plus
Math-Shepherd-formatted text, so " ки" is one token; BOS "<s>" added as Llama's tokenizer does)."""

from __future__ import annotations

import json
import math
from pathlib import Path

VOCAB = 1024
# tiny-qwen2 shapes (conf/model/tiny-qwen2.yaml); vocab_size is the tokenizer's
SHAPES = dict(
    hidden_size=256,
    intermediate_size=1024,
    num_hidden_layers=4,
    num_attention_heads=4,
    num_key_value_heads=2,
    head_dim=64,
    max_position_embeddings=4096,
    rms_norm_eps=1e-6,
    rope_theta=10000.0,
)
QWEN2_PATTERN = (
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*"
    r"|\s*[\r\n]+|\s+(?!\S)|\s+"
)
CHATML = (
    "{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n{% endfor %}"
    "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)
OVERRIDES = [f"model.vocab_size={VOCAB}", f"verifier.vocab_size={VOCAB}"]


def _math_corpus(data: Path):
    corpus = []
    for f in sorted(data.glob("math/*/test.jsonl")):
        for line in f.read_text().splitlines():
            o = json.loads(line)
            corpus += [o["problem"], str(o.get("solution", "")), f"$\\boxed{{{o['answer']}}}$"]
    return corpus


def _train_bpe(corpus, special_tokens):
    """Byte-level BPE of ``VOCAB`` tokens with Qwen2's pre-tokenizer pattern."""
    from tokenizers import Regex, Tokenizer, decoders, models, pre_tokenizers, trainers

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.Sequence(
        [
            pre_tokenizers.Split(Regex(QWEN2_PATTERN), behavior="isolated"),
            pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False),
        ]
    )
    tok.decoder = decoders.ByteLevel()
    tok.train_from_iterator(
        corpus,
        trainers.BpeTrainer(
            vocab_size=VOCAB,
            special_tokens=special_tokens,
            initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
            show_progress=False,
        ),
    )
    return tok


def build_tokenizer(out: Path, data: Path):
    from transformers import PreTrainedTokenizerFast

    from workloads.math import SYSTEM_PROMPT

    corpus = [SYSTEM_PROMPT] * 50 + ["Therefore, the final answer is: $\\boxed{\\frac{1}{2}}$.\n\n"] * 20
    tok = _train_bpe(corpus + _math_corpus(data), ["<|endoftext|>", "<|im_start|>", "<|im_end|>"])
    fast = PreTrainedTokenizerFast(tokenizer_object=tok, eos_token="<|endoftext|>", pad_token="<|endoftext|>")
    fast.chat_template = CHATML
    fast.save_pretrained(out)
    return fast


def _config(tok, architecture: str, **extra):
    from transformers import Qwen2Config

    return Qwen2Config(
        vocab_size=VOCAB,
        architectures=[architecture],
        eos_token_id=tok.eos_token_id,
        bos_token_id=tok.eos_token_id,
        torch_dtype="float32",
        **SHAPES,
        **extra,
    )


def build_generator(out: Path, tok, p_delimiter: float = 0.15, p_eos: float = 0.02, temperature: float = 0.8):
    """Random tiny Qwen2 LM whose steps end at "\\n\\n" tokens with per-token probability about
    ``p_delimiter`` and whose paths end at EOS with about ``p_eos`` (random logits are almost flat:
    every token would be ~1/VOCAB). A constant component in embedding dimension 0 survives the final
    norm; the delimiter and EOS output rows read it. Everything else stays random."""
    import torch
    from transformers import Qwen2ForCausalLM

    from systems.verifier_search.checkpoint import delimiter_ids

    torch.manual_seed(0)
    model = Qwen2ForCausalLM(_config(tok, "Qwen2ForCausalLM", tie_word_embeddings=False)).eval()
    delims = list(delimiter_ids(tok))
    with torch.no_grad():
        model.model.embed_tokens.weight[:, 0] = 1.0
        h0 = float(model.model(torch.arange(64)[None]).last_hidden_state[..., 0].mean())
        model.lm_head.weight[:, 0] = 0.0
        # weight of each delimiter / the end token relative to one ordinary token
        model.lm_head.weight[delims, 0] = temperature * math.log(p_delimiter * VOCAB / len(delims)) / h0
        model.lm_head.weight[tok.eos_token_id, 0] = temperature * math.log(p_eos * VOCAB) / h0
    model.save_pretrained(out, safe_serialization=True)
    tok.save_pretrained(out)
    return delims


def build_prm(out: Path, tok):
    """Random tiny Qwen2 PRM in vLLM's ``Qwen2ForProcessRewardModel`` layout (``model.*`` +
    ``score.0`` Linear(h, h), ReLU, ``score.2`` Linear(h, 2))."""
    import torch
    from safetensors.torch import save_file
    from transformers import Qwen2Model

    torch.manual_seed(1)
    cfg = _config(tok, "Qwen2ForProcessRewardModel", num_labels=2, tie_word_embeddings=False)
    body = Qwen2Model(cfg)
    h = SHAPES["hidden_size"]
    head = torch.nn.Sequential(torch.nn.Linear(h, h), torch.nn.ReLU(), torch.nn.Linear(h, 2))
    state = {f"model.{k}": v.contiguous() for k, v in body.state_dict().items()}
    state.update({f"score.{k}": v.contiguous() for k, v in head.state_dict().items()})
    out.mkdir(parents=True, exist_ok=True)
    save_file(state, str(out / "model.safetensors"), metadata={"format": "pt"})
    cfg.save_pretrained(out)
    tok.save_pretrained(out)


def build_all(root: Path, data: Path):
    """(generator dir, verifier dir) under ``root``."""
    tok = build_tokenizer(root / "tokenizer", data)
    build_generator(root / "gen", tok)
    build_prm(root / "prm", tok)
    return root / "gen", root / "prm"


SHEPHERD_SAMPLE = (
    "Step 1: We have x + 2 = 4, so x = 4 - 2. ки\n\nStep 2: The answer is $\\boxed{2}$. ки\n\n"
    "Step 3: Check: 2 + 2 = 4. ки"
)


def build_shepherd(out: Path, data: Path, good_bad_scale: float = 10.0):
    """Random tiny ``MistralForCausalLM`` (tiny-qwen2 shapes) + its tokenizer, a Math-Shepherd-style
    verifier. The lm_head rows of "+" and "-" are scaled by ``good_bad_scale`` so P("+") spreads
    over (0, 1) instead of sitting near 0.5. Returns the overrides that make ``verifier=math-shepherd-7b``
    describe it (shapes, dtype, step tag and good/bad ids)."""
    import torch
    from tokenizers import processors
    from transformers import MistralConfig, MistralForCausalLM, PreTrainedTokenizerFast

    tok = _train_bpe([SHEPHERD_SAMPLE] * 200 + _math_corpus(data), ["<s>", "</s>"])
    tok.post_processor = processors.TemplateProcessing(single="<s> $A", special_tokens=[("<s>", 0)])
    fast = PreTrainedTokenizerFast(tokenizer_object=tok, bos_token="<s>", eos_token="</s>")
    (tag,) = fast.encode(" ки", add_special_tokens=False)
    good, bad = fast.convert_tokens_to_ids(["+", "-"])
    torch.manual_seed(2)
    cfg = MistralConfig(
        vocab_size=VOCAB,
        sliding_window=None,
        architectures=["MistralForCausalLM"],
        bos_token_id=fast.bos_token_id,
        eos_token_id=fast.eos_token_id,
        tie_word_embeddings=False,
        torch_dtype="float32",
        **{k: v for k, v in SHAPES.items() if k != "rope_theta"},
    )
    model = MistralForCausalLM(cfg).eval()
    with torch.no_grad():
        model.lm_head.weight[[good, bad]] *= good_bad_scale
    model.save_pretrained(out, safe_serialization=True)
    fast.save_pretrained(out)
    return [
        f"verifier.{k}={v}"
        for k, v in dict(
            num_layers=SHAPES["num_hidden_layers"],
            hidden_size=SHAPES["hidden_size"],
            num_heads=SHAPES["num_attention_heads"],
            num_kv_heads=SHAPES["num_key_value_heads"],
            head_dim=SHAPES["head_dim"],
            intermediate_size=SHAPES["intermediate_size"],
            vocab_size=VOCAB,
            max_position=4096,
            dtype="float32",
            step_tag_id=tag,
            good_token_id=good,
            bad_token_id=bad,
        ).items()
    ]
