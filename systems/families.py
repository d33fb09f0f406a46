"""Every system family, the one list the harness reads (harness.family.families)."""

from systems.energy_serving import FAMILY as ENERGY_SERVING
from systems.kv_offload import FAMILY as KV_OFFLOAD
from systems.verifier_search import FAMILY as VERIFIER_SEARCH

FAMILIES = (KV_OFFLOAD, VERIFIER_SEARCH, ENERGY_SERVING)
