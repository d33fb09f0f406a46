"""The BEAM family (MLSys 26): energy-aware serving under TTFT/TBT SLOs, joint GPU frequency, chunk
size and microbatch control (``controllers.py``: vanilla, Window-DVFS, BEAM), on vLLM
(``vllm_engine.py``) or simulated (``sim.py``). One driver (``driver.py``) owns requests, decisions
and accounting; the backends apply decisions and report iterations."""

from harness.family import Family
from systems.energy_serving import config, runner

FAMILY = Family(
    name="energy_serving",
    validate=runner.validate,
    run=runner.run,
    register_configs=config.register,
    real_engine="vllm",
    validate_backend=runner.validate_backend,
    ignored_settings=runner.ignored_settings,
    former_names=("serving",),
)
