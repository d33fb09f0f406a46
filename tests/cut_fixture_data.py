"""Cut the test suite's fixture data (``tests/fixture_data/``) from a full data folder.

    python -m tests.cut_fixture_data /path/to/data      # e.g. the folder `python -m workloads.fetch` fills

The suite never reads the full data sets: ``tests/conftest.py`` points ``TTC_DATA_DIR`` at
``tests/fixture_data``, which has the data folder's layout and a small slice of each public set
(sources, commits and licences in its README.md). This script is how those slices were made, so a
maintainer can remake them; it writes nothing else. Each slice keeps the source's bytes for the
lines it keeps (no re-serialisation), except the ServeGen and ML.ENERGY JSON files, which are
re-serialised with ``json.dumps(indent=2)`` after dropping keys (the value strings are unchanged).
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

OUT = Path(__file__).resolve().parent / "fixture_data"
PROBLEMS = 5  # first problems of each math set
TRACE_ROWS = 300  # first request rows of each Azure / Mooncake trace
# ServeGen m-large: clients active in BEAM's 19:00-20:00 segment, with token-length PDFs (0, 3, 20)
# and without (15, 21: they draw from the pooled PDFs), and one idle in that hour (1)
SERVEGEN_M_LARGE = (0, 1, 3, 15, 20, 21)
SERVEGEN_M_LARGE_KEYS = ("0", "64800")  # dataset keys: the 6-hour PDF covering 19:00-20:00
SERVEGEN_R1 = (3, 13)  # deepseek-r1 clients, both with a dataset file
PERSEUS = "gpt3-175b+a100_sxm_bf16.csv"  # one of the two Perseus A100 stage profiles
MLENERGY = "meta-llama__Llama-3.1-8B-Instruct__lm-arena-chat.json"  # its H100 configurations only


def _head(src: Path, dst: Path, lines: int) -> None:
    dst.parent.mkdir(parents=True, exist_ok=True)
    kept = src.read_bytes().split(b"\n")[:lines]
    dst.write_bytes(b"\n".join(kept) + b"\n")


def _json(dst: Path, obj) -> None:
    dst.parent.mkdir(parents=True, exist_ok=True)
    dst.write_text(json.dumps(obj, indent=2))  # as workloads.fetch's day-1 cut writes JSON


def cut(src: Path, out: Path = OUT) -> list:
    """Write every slice from the full data folder ``src`` into ``out``; returns the files written."""
    done = []
    for name in ("aime24", "amc23", "math500"):
        rel = f"math/{name}/test.jsonl"
        _head(src / rel, out / rel, PROBLEMS)
        done.append(rel)
    for rel in (
        "traces/azure_llm_2023/AzureLLMInferenceTrace_code.csv",
        "traces/azure_llm_2023/AzureLLMInferenceTrace_conv.csv",
    ):
        _head(src / rel, out / rel, TRACE_ROWS + 1)  # + the header
        done.append(rel)
    for rel in ("traces/mooncake/conversation_trace.jsonl", "traces/mooncake/synthetic_trace.jsonl"):
        _head(src / rel, out / rel, TRACE_ROWS)
        done.append(rel)
    for folder, clients, keys in (
        ("traces/servegen/language/m-large", SERVEGEN_M_LARGE, SERVEGEN_M_LARGE_KEYS),
        ("traces/servegen/reason/deepseek-r1", SERVEGEN_R1, None),
    ):
        for cid in clients:
            rel = f"{folder}/chunk-{cid}-trace.csv"
            (out / rel).parent.mkdir(parents=True, exist_ok=True)
            (out / rel).write_bytes((src / rel).read_bytes())  # one day: 144 rows
            done.append(rel)
            ds = src / folder / f"chunk-{cid}-dataset.json"
            if ds.exists():
                d = json.loads(ds.read_text())
                _json(out / folder / ds.name, {k: v for k, v in d.items() if keys is None or k in keys})
                done.append(f"{folder}/{ds.name}")
    rel = f"gpu_power/perseus_a100_sxm/{PERSEUS}"
    (out / rel).parent.mkdir(parents=True, exist_ok=True)
    (out / rel).write_bytes((src / rel).read_bytes())
    done.append(rel)
    rel = f"gpu_power/mlenergy_leaderboard_v3/{MLENERGY}"
    d = json.loads((src / rel).read_text())
    d["configurations"] = [c for c in d["configurations"] if c["gpu_model"] == "H100"]
    _json(out / rel, d)
    done.append(rel)
    return done


if __name__ == "__main__":
    if len(sys.argv) != 2 or sys.argv[1] in ("-h", "--help"):
        print(__doc__)
        sys.exit(0 if len(sys.argv) == 2 else 2)
    for rel in cut(Path(sys.argv[1])):
        print(rel)
