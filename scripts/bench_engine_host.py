"""Host work per decoded token of the LBS-family engine against transformers eager, on this CPU.

    .venv/bin/python scripts/bench_engine_host.py [--beams 64] [--tokens 32] [--rounds 5]

At a shape where host work dominates (issue 37: tiny-opt cut to hidden 64, FFN 128, vocabulary 1,000;
64 beams; prompt 32), one torch thread: our engine's ``in_gpu`` step (``TorchExecutor.execute_step``:
the model forward through our cache, sampling keyed by (seed, beam uid, position), the log-probs),
transformers' own eager decode (``DynamicCache``, greedy: the least host work a decode loop can do;
the goal's baseline) and the same loop sampling each token (``softmax`` + ``torch.multinomial``, as
``generate(do_sample=True)`` does at its core: the work our engine does per token), the same
weights. For each: the process CPU seconds per decoded token (the best of ``--rounds`` rounds, after
a warm-up round) and the aten operators dispatched per token and per layer (``TorchDispatchMode``).
Prints the ratios ours / transformers; the issue's goal is a host time per token of at most 0.5x
transformers' greedy loop. A benchmark prints ratios; no test times it
(``tests/kv_offload/test_torch_engine.py`` runs it once at two beams, for its output only).
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import torch
from omegaconf import OmegaConf
from torch.utils._python_dispatch import TorchDispatchMode

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from systems.kv_offload.model import build_model  # noqa: E402
from systems.kv_offload.plan import make_scheduler  # noqa: E402
from systems.kv_offload.torch_engine import TorchExecutor  # noqa: E402
from systems.kv_offload.tree import BeamTree, initial_beams  # noqa: E402

PROMPT = 32


class CountOps(TorchDispatchMode):
    """Counts the aten operators dispatched inside the block."""

    def __init__(self):
        super().__init__()
        self.n = 0

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        self.n += 1
        return func(*args, **(kwargs or {}))


def model_config():
    m = OmegaConf.load(ROOT / "conf/model/tiny-opt.yaml")
    m.pop("defaults")
    m.hidden_size, m.intermediate_size, m.vocab_size = 64, 128, 1000
    m.num_heads, m.num_kv_heads, m.head_dim = 4, 4, 16
    m.hf_config.word_embed_proj_dim = 64
    return m


def ours(mcfg, built, beams: int, tokens: int, count: bool):
    """(CPU seconds, aten ops) of one in_gpu step of ``tokens`` tokens for ``beams`` beams."""
    ex = TorchExecutor(mcfg, "cpu", None, seed=0, model=built)
    prompt = list(range(1, PROMPT + 1))
    tree = BeamTree(PROMPT)
    ex.prefill(tree, prompt, offload=False)
    live = initial_beams(tree, beams, 0)
    sched = make_scheduler("in_gpu", ex.geom, None, prompt_len=PROMPT, gen_len=tokens)
    plan = sched.plan(0, tree, live, tokens)
    counter = CountOps()
    t0 = time.process_time()
    if count:
        with counter:
            ex.execute_step(plan, tree, live)
    else:
        ex.execute_step(plan, tree, live)
    cpu = time.process_time() - t0
    ex.close()
    return cpu, counter.n


def piecewise_host_ops(mcfg, built, beams: int, tokens: int) -> float:
    """Aten ops per token the piecewise path dispatches outside its pieces (attention, K/V writes,
    sampling, the inputs' copies): what a GPU's host still issues per token when the pieces replay
    as CUDA graphs (here they run eagerly, and their ops are subtracted)."""
    from systems.kv_offload.piecewise import _Pieces

    ex = TorchExecutor(mcfg, "cpu", None, seed=0, model=built, decode_path="piecewise", max_beams=beams)
    prompt = list(range(1, PROMPT + 1))
    tree = BeamTree(PROMPT)
    ex.prefill(tree, prompt, offload=False)
    live = initial_beams(tree, beams, 0)
    plan = make_scheduler("in_gpu", ex.geom, None, prompt_len=PROMPT, gen_len=tokens).plan(0, tree, live, tokens)
    total, inside = CountOps(), [0]
    run = _Pieces.run

    def counted_run(self, i):
        n0 = total.n
        run(self, i)
        inside[0] += total.n - n0

    _Pieces.run = counted_run
    try:
        with total:
            ex.execute_step(plan, tree, live)
    finally:
        _Pieces.run = run
        ex.close()
    return (total.n - inside[0]) / tokens


def transformers_eager(built, beams: int, tokens: int, count: bool, sample: bool = False):
    """(CPU seconds, aten ops) of ``tokens`` decode tokens with transformers' DynamicCache: greedy
    (``log_softmax``, ``argmax``), or ``sample``: each token drawn from the distribution as
    ``generate(do_sample=True)`` does at its core (``softmax``, ``torch.multinomial``; no logits
    processors), the work our engine does per token."""
    from transformers import DynamicCache

    model, _ = built
    cache = DynamicCache()
    ids = torch.arange(1, PROMPT + 1)[None].expand(beams, -1)
    with torch.no_grad():
        logits = model(input_ids=ids, past_key_values=cache, use_cache=True, logits_to_keep=1).logits
        counter = CountOps()
        t0 = time.process_time()

        def loop(logits):
            for _ in range(tokens):
                if sample:
                    y = torch.multinomial(torch.softmax(logits[:, -1], dim=-1), 1)[:, 0]
                else:
                    y = torch.log_softmax(logits[:, -1], dim=-1).argmax(-1)
                logits = model(input_ids=y[:, None], past_key_values=cache, use_cache=True).logits

        if count:
            with counter:
                loop(logits)
        else:
            loop(logits)
        return time.process_time() - t0, counter.n


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--beams", type=int, default=64, help="beams decoded together (default 64)")
    ap.add_argument("--tokens", type=int, default=32, help="decode tokens per timed round (default 32)")
    ap.add_argument("--rounds", type=int, default=5, help="timed rounds after a warm-up; the best counts (default 5)")
    a = ap.parse_args(argv)
    bad = [f"--{k} {v}: at least 1" for k, v in vars(a).items() if v < 1]
    if bad:
        print("error: " + "; ".join(bad), file=sys.stderr)
        return 2
    torch.set_num_threads(1)
    mcfg = model_config()
    built = build_model(mcfg, seed=0)
    layers = mcfg.num_layers
    rows = {}
    for name, fn in (
        ("ours", lambda c: ours(mcfg, built, a.beams, a.tokens, c)),
        ("transformers", lambda c: transformers_eager(built, a.beams, a.tokens, c)),
        ("tf sampling", lambda c: transformers_eager(built, a.beams, a.tokens, c, sample=True)),
    ):
        fn(False)  # warm-up
        best = min(fn(False)[0] for _ in range(a.rounds))
        ops = fn(True)[1]
        rows[name] = (best / a.tokens, ops / a.tokens)
        print(
            f"{name:13s} {1e3 * rows[name][0]:8.3f} ms CPU per token   {rows[name][1]:7.1f} aten ops per token "
            f"({rows[name][1] / layers:.1f} per layer)"
        )
    outside = piecewise_host_ops(mcfg, built, a.beams, a.tokens)
    print(
        f"piecewise path: {outside:.1f} aten ops per token outside its CUDA-graph pieces "
        f"({outside / layers:.1f} per layer): what a GPU's host still dispatches"
    )
    (t_o, n_o), (t_t, n_t), (t_s, n_s) = rows["ours"], rows["transformers"], rows["tf sampling"]
    print(
        f"ratio ours / transformers (greedy): host time {t_o / t_t:.2f}x (goal <= 0.5x), aten ops {n_o / n_t:.2f}x "
        f"({a.beams} beams, {a.tokens} tokens, hidden 64, FFN 128, vocabulary 1000, {layers} layers, 1 thread)"
    )
    print(
        f"ratio ours / transformers sampling (the same work per token): host time {t_o / t_s:.2f}x, aten ops {n_o / n_s:.2f}x"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
