"""The speculation policy (FastTTS §4.1): its decisions on a scripted event sequence, and the
simulated generator executing whatever it decides (the vLLM generator: tests/verifier_search/test_vllm.py)."""

from typing import Dict, List

from systems.verifier_search.memory import ModelShape, Roofline
from systems.verifier_search.protocol import GenRequest
from systems.verifier_search.sim import SimGenerator, StepModel, TokenSource
from systems.verifier_search.speculation import SPECULATE, STOP, SpeculationPolicy

R = GenRequest("r", [1, 2, 3], max_tokens=16, seed=0)
LAST = GenRequest("last", [1, 2, 3], max_tokens=16, seed=0, stop_at_delimiter=False)


def test_scripted_events_give_the_papers_decisions():
    """One iteration's events in order, with the decision FastTTS §4.1.2 asks for at each.

    Mutations caught: dropping ``waiting == 0`` (Phase 1 speculates); dropping the ``finish ==
    "delimiter"`` check (a step cut at its cap speculates); dropping ``standard == 0`` (speculation
    outlives the last straggler); dropping ``waiting > 0`` or ``pressure`` from the abort rule
    (preemption leaves speculation running); sorting the cap by descending potential (the most
    promising beams are aborted first); not doubling max_tokens (no room to speculate)."""
    on, off = SpeculationPolicy(True, max_beams=2), SpeculationPolicy(False)
    assert on.max_tokens(R) == 32 and off.max_tokens(R) == 16 and on.max_tokens(LAST) == 16
    # Phase 1: a request ends its step while 3 still wait for a slot -> stop, as a stop string would
    assert on.at_step_end(R, "delimiter", waiting=3) == STOP
    # Phase 2: every path running -> keep decoding past "\n\n"
    assert on.at_step_end(R, "delimiter", waiting=0) == SPECULATE
    # steps ended by the end token or the step cap, S off, the last iteration: never speculate
    assert on.at_step_end(R, "eos", 0) == on.at_step_end(R, "length", 0) == STOP
    assert off.at_step_end(R, "delimiter", 0) == STOP and on.at_step_end(LAST, "delimiter", 0) == STOP
    spec = {"a": 3, "b": 1, "c": 2}
    # stragglers still running, within the cap of 2 -> continue
    assert on.to_abort(standard=4, speculative={"a": 3, "c": 2}, waiting=0, pressure=False) == []
    # a third speculative beam over the cap of 2 -> the one of lowest potential goes
    assert on.to_abort(standard=4, speculative=spec, waiting=0, pressure=False) == ["b"]
    # memory pressure or a request waiting (new or preempted) -> all speculation stops (Phase 1)
    assert on.to_abort(4, spec, waiting=0, pressure=True) == ["a", "b", "c"]
    assert on.to_abort(4, spec, waiting=1, pressure=False) == ["a", "b", "c"]
    # the last straggler ended its step -> speculation ends with it (no tail latency)
    assert on.to_abort(standard=0, speculative={"a": 3}, waiting=0, pressure=False) == ["a"]
    assert on.to_abort(0, {}, 0, False) == []


class ScriptedPolicy(SpeculationPolicy):
    """A policy whose rules contradict the paper's (so a generator with rules of its own would
    show them): ``always`` SPECULATE at every step end (even one cut at its cap) and never abort,
    or STOP every step. Records every call."""

    def __init__(self, always: bool):
        super().__init__(enabled=True, max_beams=256)
        object.__setattr__(self, "always", always)
        object.__setattr__(self, "calls", [])

    def at_step_end(self, r, finish, waiting):
        self.calls.append(("at_step_end", r.uid, finish))
        return SPECULATE if self.always else STOP

    def to_abort(self, standard, speculative, waiting, pressure):
        self.calls.append(("to_abort", standard, len(speculative)))
        return []


EOS, DELIM = 151643, 271


def check_generator_obeys(gen, requests: List[GenRequest]):
    """Shared by the simulated and the vLLM generator: with a policy that always speculates and
    never aborts, every request decodes to its cap (or the end token); with one that always
    stops, no request has a speculative token. Each request's step end is reported once."""
    for always in (True, False):
        pol = ScriptedPolicy(always)
        res = gen.extend(requests, pol)
        ends: Dict[str, int] = {}
        for name, uid, _ in (c for c in pol.calls if c[0] == "at_step_end"):
            ends[uid] = ends.get(uid, 0) + 1
        assert ends == {r.uid: 1 for r in requests}
        for r in requests:
            o = res.outputs[r.uid]
            if always:
                assert len(o.tokens) == pol.max_tokens(r) or o.tokens[-1] == EOS, (r.uid, len(o.tokens), o.finish)
            else:
                assert len(o.tokens) == o.step_len, (r.uid, o.finish)
        assert (res.spec_tokens > 0) == always
        assert any(c[0] == "to_abort" and c[2] > 0 for c in pol.calls) == always  # consulted while speculating


TINY = ModelShape(
    num_params=4e7,
    num_layers=4,
    hidden_size=256,
    kv_bytes_per_token=2048,
    weight_bytes=1.6e8,
    vocab_size=151936,
    head_params=3.9e7,
    dtype_bytes=4,
)


def sim_generator(max_num_seqs=64, kv_bytes=64 << 20):
    steps = StepModel(1 / 4, 1 / 64, DELIM, EOS, 151936)
    return SimGenerator(
        TINY,
        Roofline(5e10, 1e10),
        TokenSource(steps),
        kv_bytes=kv_bytes,
        max_num_seqs=max_num_seqs,
        block=32,
        token_budget=4096,
        max_model_len=4096,
    )


def test_sim_generator_executes_the_policy():
    reqs = [GenRequest(f"r{i}", list(range(1000, 1040)), max_tokens=16, seed=i) for i in range(8)]
    check_generator_obeys(sim_generator(), reqs)


def test_sim_generator_phase1_and_cap_follow_the_policy():
    """With the real policy, a batch cap of 4 for 8 requests: the first ones to end their step
    while others wait stop (Phase 1); the cap of speculative beams holds after every event."""
    reqs = [GenRequest(f"r{i}", list(range(1000, 1040)), max_tokens=16, seed=i) for i in range(8)]
    res = sim_generator(max_num_seqs=4).extend(reqs, SpeculationPolicy(True, max_beams=256))
    first = list(res.outputs)[:4]  # each ended while a request was still queued
    assert all(res.outputs[u].step_len == len(res.outputs[u].tokens) for u in first)
    assert res.spec_tokens > 0
    with_cap = sim_generator().extend(reqs, SpeculationPolicy(True, max_beams=0))
    assert with_cap.spec_tokens == 0


def test_policy_and_protocol_modules_import_no_engine():
    """The search, its policies and the protocol import neither torch nor vLLM, and importing the
    vLLM engine module sets no vLLM environment variable (it used to set
    VLLM_ENABLE_V1_MULTIPROCESSING at import). Mutation caught: an import-time ``os.environ`` or
    torch import in any of them."""
    import subprocess
    import sys

    from tests.conftest import ROOT

    code = (
        "import os, sys\n"
        "import systems.verifier_search.protocol, systems.verifier_search.speculation, systems.verifier_search.memory_plan, systems.verifier_search.search, "
        "systems.verifier_search.vllm_engine\n"
        "assert 'torch' not in sys.modules and 'vllm' not in sys.modules, sorted(m for m in sys.modules "
        "if m.split('.')[0] in ('torch', 'vllm'))[:3]\n"
        "assert not [k for k in os.environ if k.startswith('VLLM')]\n"
    )
    env = {k: v for k, v in __import__("os").environ.items() if not k.startswith("VLLM")}
    r = subprocess.run([sys.executable, "-c", code], cwd=ROOT, env=env, capture_output=True, text=True)
    assert r.returncode == 0, r.stderr[-500:]
