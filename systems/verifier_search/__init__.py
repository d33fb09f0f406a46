"""The FastTTS family (ASPLOS 26): generator + verifier test-time search on vLLM
(``vllm_engine.py``) or simulated (``sim.py``): its vLLM baseline (``vllm_tts``), the three FastTTS
techniques (S: speculative beam extension, P: prefix-aware scheduling, M: asymmetric memory
allocation) and their ablations. The search (``search.py``) is the policy both engines serve."""

from harness.family import Family
from systems.verifier_search import config, runner

FAMILY = Family(
    name="verifier_search",
    validate=runner.validate,
    run=runner.run,
    register_configs=config.register,
    real_engine="vllm",
    validate_backend=runner.validate_backend,
    uses_verifier=True,
    former_names=("tts",),
)
