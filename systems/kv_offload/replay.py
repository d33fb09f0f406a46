"""Record a run's beam tree and replay it in another run (``system.record_tree`` / ``system.replay_tree``).

``beam_tree.json`` holds, per step transition, the uids of the beams selection kept, and the
configuration that produced them: the fields in :data:`SEARCH_FIELDS` (a replay keeps the recorded
beams by uid, and uids follow from the seed, beams, beam width and step count; the model, prompt
length and temperature decided which beams were kept) and where it ran (backend, device, hardware
profile). A replay whose configuration differs in any of those fields is a ConfigError before any
work, naming each field with its recorded and given value.
"""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any, Dict, List, Optional, Tuple

from harness.errors import ConfigError

FILE = "beam_tree.json"
# field in beam_tree.json -> (config section, key); the search a replay repeats depends on each
SEARCH_FIELDS = {
    "model": ("model", "name"),
    "dtype": ("model", "dtype"),
    "seed": (None, "seed"),
    "beams": ("workload", "beams"),
    "beam_width": ("workload", "beam_width"),
    "step": ("workload", "step"),
    "gen_len": ("workload", "gen_len"),
    "prompt_len": ("workload", "prompt_len"),
    "temperature": ("workload", "temperature"),
}


def _given(cfg, field: str) -> Any:
    section, key = SEARCH_FIELDS[field]
    return (cfg if section is None else cfg[section]).get(key)


def tree_record(
    cfg, backend, kept_log: List[dict], beam_log: Optional[List[dict]] = None, decode_path: Optional[str] = None
) -> Dict[str, Any]:
    """The content of ``beam_tree.json`` for a run of ``cfg`` on ``backend`` (harness.backend.Backend).
    ``beam_log`` (real runs): per step, every live beam's uid, parent uid, tokens and cumulative
    log-probability after the step (and, teacher-forced, its token flips): what
    ``system.teacher_force`` decodes and ``systems.kv_offload.divergence`` compares; ``decode_path``
    the real engine's (``TorchExecutor.decode_path``)."""
    doc = {
        **{f: _given(cfg, f) for f in SEARCH_FIELDS},
        "backend": backend.name,
        "device": backend.device,
        "simulated": backend.simulated,
        "hardware_profile": cfg.hardware.name,
        "decode_path": decode_path,
        "batch_invariant": bool(cfg.system.get("batch_invariant", False)),
        "scheduler": cfg.system.scheduler,
        "steps": kept_log,
    }
    if beam_log:
        doc["beam_log"] = beam_log
    return doc


def forced_tokens(doc: Dict[str, Any], path) -> List[Dict[int, List[int]]]:
    """Per step, beam uid -> its recorded tokens (``system.teacher_force``). Raises ConfigError when
    the tree holds no tokens (a simulated run's, or one recorded before tokens were)."""
    if not doc.get("beam_log"):
        raise ConfigError(
            f"system.teacher_force=true: system.replay_tree={str(path)!r} holds no tokens; record the tree "
            f"on the real engine (backend=torch, system.record_tree=true)"
        )
    return [{int(u): t for u, t in zip(s["uid"], s["tokens"])} for s in doc["beam_log"]]


def load_beam_tree(path, cfg) -> Tuple[List[List[int]], Dict[str, Any]]:
    """(kept uids per step transition, the file's header) of the recorded tree at ``path`` (a run
    directory or its ``beam_tree.json``), checked against ``cfg``. Raises ConfigError if the file is
    missing or malformed, or if a recorded search field (:data:`SEARCH_FIELDS`; files written before
    a field was recorded are not checked on it) or the number of steps differs from ``cfg``'s."""
    p = Path(path)
    if p.is_dir():
        p = p / FILE
    from harness.inputs import read_text

    try:
        doc = json.loads(read_text(p, "system.replay_tree", "a beam tree (beam_tree.json)", 1 << 30))
        steps = [[int(u) for u in s["kept"]] for s in doc["steps"]]
    except (OSError, ValueError, KeyError, TypeError) as e:
        raise ConfigError(
            f"system.replay_tree={str(path)!r} is not a readable beam tree ({e}); "
            f"record one with system.record_tree=true"
        ) from None
    diff = [
        f"{f}: recorded {doc[f]!r}, given {_given(cfg, f)!r}"
        for f in SEARCH_FIELDS
        if f in doc and doc[f] != _given(cfg, f)
    ]
    if diff:
        raise ConfigError(
            f"system.replay_tree={str(path)!r} was recorded with another search "
            f"configuration ({'; '.join(diff)}); replay it with the recorded values"
        )
    n_steps = math.ceil(cfg.workload.gen_len / cfg.workload.step)
    if len(steps) != n_steps - 1:
        raise ConfigError(
            f"system.replay_tree={str(path)!r} has {len(steps)} step transitions; this "
            f"configuration needs {n_steps - 1} (same beams, step and gen_len)"
        )
    return steps, doc


def replay_note(path, doc: Dict[str, Any], cfg, backend) -> str:
    """One sentence for the replay's output: where the tree was recorded, which hardware this run
    measures or simulates, and whether their times are comparable."""
    if "backend" not in doc:
        where = "(its backend was not recorded)"
    elif doc["simulated"]:
        where = f"on the simulated '{doc['hardware_profile']}' profile"
    else:
        where = f"on the real {doc['backend']} engine, {doc['device'].upper()} (measured)"
    here = (
        f"this run simulates the '{cfg.hardware.name}' hardware profile"
        if backend.simulated
        else f"this run measures the real {backend.name} engine on {backend.device.upper()}"
    )
    note = f"replayed the beam tree of {path} recorded {where}; {here}"
    if backend.simulated and "backend" in doc:
        if doc["simulated"]:
            same, match = doc["hardware_profile"] == cfg.hardware.name, f"hardware={doc['hardware_profile']}"
        elif doc["device"] == "cpu":
            same, match = cfg.hardware.kind == "cpu", "hardware=cpu, or a calibrated CPU profile"
        else:
            same, match = cfg.hardware.kind == "gpu", "the recorded GPU's profile"
        if not same:
            note += (
                f": its times and energy are not comparable with the recorded run's (to compare, replay with {match})"
            )
    return note
