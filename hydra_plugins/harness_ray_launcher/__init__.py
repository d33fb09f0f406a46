"""``hydra/launcher=ray``: each job of a sweep runs as a Ray task, through Hydra's own ``run_job``, so
it writes the same record as under the local launcher. Written on Hydra's public Launcher
interface (``hydra.plugins.launcher``, ``hydra.core.utils.run_job``).

Why not hydra-ray-launcher 1.2.2 (the newest): it pins ``cloudpickle<3`` while joblib >= 1.5 (our
local launcher) needs ``cloudpickle>=3``, so a fresh install downgrades joblib; it pulls
``ray[default]`` with boto3; and its Ray resources are one setting for every job of a sweep.

Resources (``resources`` in ``conf/hydra/launcher/ray.yaml``, one config for every job): a job asks
for ``resources.gpu_job`` (a GPU) only when its backend needs one, else ``resources.cpu_job``
(CPUs only); see :func:`needs_gpu`. ``init`` goes to ``ray.init``: ``address: null`` joins the
cluster that ``ray start --head`` made on this machine, else starts a local one for the sweep.
Every node needs the project at the same path (or installed) and the data it reads.

A job whose task raises outside the run, or whose worker dies, comes back as a failed
``JobReturn``; the sweeper records it as ``error`` and goes on.
"""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any, Dict, List, Optional, Sequence

from hydra.core.hydra_config import HydraConfig
from hydra.core.singleton import Singleton
from hydra.core.utils import JobReturn, JobStatus, configure_log, filter_overrides, run_job, setup_globals
from hydra.plugins.launcher import Launcher
from hydra.types import HydraContext, TaskFunction
from omegaconf import DictConfig, OmegaConf, open_dict

log = logging.getLogger(__name__)


def needs_gpu(backend_name: str, device: str, cluster_has_gpu: bool) -> bool:
    """Whether a job asks Ray for a GPU.

    ``backend=sim``: never (simulated). A real engine (``torch``/``vllm``) with ``backend.device=cpu``:
    never; with ``device=cuda``: always (the job fails where none is given). ``auto`` (backend or
    device): when the cluster has a GPU, since the job then runs its real engine on it; on a
    CPU-only cluster it runs on CPUs (``backend=auto`` then resolves to the simulator there).
    """
    if backend_name == "sim" or device == "cpu":
        return False
    if device == "cuda":
        return True
    return cluster_has_gpu


class RayLauncher(Launcher):
    def __init__(self, init: Optional[DictConfig] = None, resources: Optional[DictConfig] = None) -> None:
        self.init = _plain(init)
        self.resources = _plain(resources)
        self.hydra_context: Optional[HydraContext] = None
        self.task_function: Optional[TaskFunction] = None
        self.config: Optional[DictConfig] = None

    def setup(self, *, hydra_context: HydraContext, task_function: TaskFunction, config: DictConfig) -> None:
        self.hydra_context, self.task_function, self.config = hydra_context, task_function, config

    def launch(self, job_overrides: Sequence[Sequence[str]], initial_job_idx: int) -> Sequence[JobReturn]:
        import ray

        setup_globals()
        configure_log(self.config.hydra.hydra_logging, self.config.hydra.verbose)
        Path(str(self.config.hydra.sweep.dir)).mkdir(parents=True, exist_ok=True)
        if not ray.is_initialized():
            ray.init(**self.init)
        has_gpu = ray.cluster_resources().get("GPU", 0) > 0
        log.info(f"Ray launcher: {len(job_overrides)} jobs on a cluster with {ray.cluster_resources()}")
        task = ray.remote(_run_job)
        pending = []
        for idx, overrides in enumerate(job_overrides, start=initial_job_idx):
            cfg = self.hydra_context.config_loader.load_sweep_config(self.config, list(overrides))
            with open_dict(cfg):
                cfg.hydra.job.id = f"ray_{idx}"
                cfg.hydra.job.num = idx
            kind = "gpu_job" if needs_gpu(cfg.backend.name, cfg.backend.device, has_gpu) else "cpu_job"
            log.info(f"\t#{idx} ({kind}: {self.resources[kind]}) : {' '.join(filter_overrides(overrides))}")
            ref = task.options(**self.resources[kind]).remote(
                self.hydra_context, cfg, self.task_function, Singleton.get_state()
            )
            pending.append((list(overrides), ref))
        return [_result(overrides, ref) for overrides, ref in pending]


def _run_job(
    hydra_context: HydraContext, cfg: DictConfig, task_function: TaskFunction, singleton_state: Dict[Any, Any]
) -> JobReturn:
    """In the Ray worker: Hydra's global state from the driver, then Hydra's ``run_job``."""
    setup_globals()
    Singleton.set_state(singleton_state)
    HydraConfig.instance().set_config(cfg)
    return run_job(
        hydra_context=hydra_context,
        task_function=task_function,
        config=cfg,
        job_dir_key="hydra.sweep.dir",
        job_subdir_key="hydra.sweep.subdir",
    )


def _result(overrides: List[str], ref: Any) -> JobReturn:
    """The job's ``JobReturn``; a failed one when its task raised or its worker died."""
    import ray

    try:
        return ray.get(ref)
    except Exception as e:  # ray.exceptions.RayTaskError, WorkerCrashedError, ...
        ret = JobReturn(overrides=overrides, status=JobStatus.FAILED)
        ret.return_value = e
        return ret


def _plain(node: Any) -> Dict[str, Any]:
    return OmegaConf.to_container(node, resolve=True) if isinstance(node, DictConfig) else dict(node or {})
