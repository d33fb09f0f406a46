"""FastTTS as its artifact ran it: the verifier rules of the FastTTS AE (``davidshiao55/TTC``,
``FastTTS-AE/``, commit 5bf35f5, on vLLM 0.9.2), in one place for both backends (the simulator,
``sim.py``, and the real engines, ``vllm_engine.py``).

- **Verifier prefix cache** (``system.verifier_prefix_cache``: auto | true | false). vLLM 0.9.2's
  ``vllm/config.py`` turns automatic prefix caching (and chunked prefill) off for a
  pooling model whose pooling type is not LAST (``VllmConfig.__post_init__``: 'Only "last" pooling
  supports chunked prefill and prefix caching; disabling both.'); the AE's Skywork PRM (``Qwen2ForPrmModel`` plugin)
  pools ALL tokens and its Math-Shepherd runs the STEP pooler (``task="reward"``), so the AE
  re-prefills every path's whole text at every verification. ``auto`` = that rule
  (:func:`verifier_prefix_cache`); ``true`` / ``false`` force it.
- **Verifier inputs** (``verifier.input_truncation`` / ``verifier.input_limit``; the AE's values are
  each verifier's defaults in ``conf/verifier``). Skywork (``models/reward_utils.prepare_input``):
  BOS + problem + "\\n", then the response left-truncated to ``3072 - |prompt| - 1`` tokens
  (``response_left``); Math-Shepherd (``models/tts_llm._score_outputs_math_shepherd``): system
  prompt + "\\n" + question + "\\n" + " " + the steps, the whole input cut at 4096 tokens
  (``right``, tokenizer default side). A step whose score position is cut away gets no score from
  that call (:data:`CUT`): the AE's score list is then shorter (``agg_strategy=last`` reads the last
  score there is).
- **Completion time** (``system.completion_stamp``): the AE stamps a path's completion time
  (``search/beam_search.py``: ``beam.completion_time = total_generator_latency_s +
  total_verifier_latency_s``) before the completing iteration's verifier call
  (``before_verifier``, default); ``after_verifier`` counts that call too (ours until 2026-12-05).
"""

from __future__ import annotations

import math
from typing import List, Sequence, Tuple

PREFIX_CACHE = ("auto", "true", "false")  # system.verifier_prefix_cache
TRUNCATIONS = ("none", "response_left", "right")  # verifier.input_truncation
COMPLETION_STAMPS = ("before_verifier", "after_verifier")  # system.completion_stamp
CUT = -1  # a score position cut away by the input truncation (no row, no score)
CUT_SCORE = math.nan  # the value a verifier returns for a step whose position was cut away


def pooling_type(verifier_cfg) -> str:
    """The pooling type the AE's vLLM 0.9.2 ran the verifier with: STEP for Math-Shepherd
    (``prm_kind=lm``: ``task="reward"``, step tag pooling), ALL for the Skywork-style value-head PRMs."""
    return "STEP" if str(verifier_cfg.prm_kind) == "lm" else "ALL"


def prefix_cache_setting(value) -> str:
    """``system.verifier_prefix_cache`` as one of :data:`PREFIX_CACHE` (Hydra reads true / false as
    booleans); ValueError for anything else."""
    v = str(value).lower()
    if v not in PREFIX_CACHE:
        raise ValueError(f"system.verifier_prefix_cache={value!r}; allowed: {', '.join(PREFIX_CACHE)}")
    return v


def verifier_prefix_cache(setting, verifier_cfg) -> bool:
    """Whether the verifier engine caches prefixes. ``auto``: vLLM 0.9.2's rule (``vllm/config.py``,
    ``VllmConfig.__post_init__``: a pooling model whose pooler is not LAST gets ``enable_prefix_caching=False``
    and ``enable_chunked_prefill=False``), i.e. off for the ALL / STEP pooling PRMs of the AE."""
    v = prefix_cache_setting(setting)
    if v == "auto":
        return pooling_type(verifier_cfg) == "LAST"
    return v == "true"


class TruncatedInput:
    """A verifier input builder (``vllm_engine.TokenMap``, ``checkpoint.VerifierText`` /
    ``ShepherdText``) whose inputs are truncated as the AE's (module docstring). ``build`` returns
    (ids, positions) with :data:`CUT` for a position cut away; other attributes are the builder's."""

    def __init__(self, inner, mode: str, limit: int):
        if mode not in TRUNCATIONS:
            raise ValueError(f"verifier.input_truncation={mode!r}; allowed: {', '.join(TRUNCATIONS)}")
        self.inner, self.mode, self.limit = inner, mode, int(limit)

    def __getattr__(self, name):
        return getattr(self.inner, name)

    def build(self, prompt: List[int], tokens: List[int], step_ends: List[int]) -> Tuple[List[int], List[int]]:
        ids, pos = self.inner.build(prompt, tokens, step_ends)
        return truncate(ids, pos, len(prompt), self.mode, self.limit)


def truncate(ids: List[int], pos: Sequence[int], prompt_len: int, mode: str, limit: int) -> Tuple[List[int], List[int]]:
    """Truncate a verifier input of ``prompt_len`` prompt ids + response ids (``pos``: each step's
    score position). ``response_left``: the response keeps its last ``limit - prompt_len - 1`` ids
    (Skywork, ``max_length=3072-len(prompt_ids)-1`` with ``truncation_side="left"``); ``right``: the
    input keeps its first ``limit`` ids (Math-Shepherd, ``max_length=4096``). Positions cut away
    become :data:`CUT`."""
    if mode == "none":
        return ids, list(pos)
    if mode == "response_left":
        keep = max(0, limit - prompt_len - 1)
        cut = len(ids) - prompt_len - keep
        if cut <= 0:
            return ids, list(pos)
        out = ids[:prompt_len] + ids[prompt_len + cut :]
        return out, [p - cut if p >= prompt_len + cut else CUT for p in pos]
    if mode == "right":
        if len(ids) <= limit:
            return ids, list(pos)
        return ids[:limit], [p if p < limit else CUT for p in pos]
    raise ValueError(f"verifier.input_truncation={mode!r}; allowed: {', '.join(TRUNCATIONS)}")


def mark_cut(values: List, pos: Sequence[int]) -> List:
    """``values`` with :data:`CUT_SCORE` where the position was cut away."""
    return [CUT_SCORE if p == CUT else v for v, p in zip(values, pos)]


def input_builder(tmap, verifier_cfg):
    """``tmap`` wrapped in the verifier's input truncation (``verifier.input_truncation``), or as it is."""
    mode = str(verifier_cfg.get("input_truncation", "none") or "none")
    if mode == "none":
        return tmap
    return TruncatedInput(tmap, mode, int(verifier_cfg.input_limit))
