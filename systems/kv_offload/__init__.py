"""The LBS family (MLSys 26): step-wise beam search whose KV cache overflows the GPU, on our own
engine (``torch_engine.py``) or simulated (``sim.py``). Systems: ``in_gpu``, ``layerwise`` and
``lbs`` (+ ablations), ``hf_offload``. A step: the scheduler plans (``plan.py`` -> ``StepPlan``),
an executor carries the plan out, the beam tree selects and expands (``tree.py``)."""

from harness.family import Family
from systems.kv_offload import config, runner

FAMILY = Family(
    name="kv_offload",
    validate=runner.validate,
    run=runner.run,
    register_configs=config.register,
    real_engine="torch",
    validate_backend=runner.validate_backend,
    former_names=("ttc",),
)
