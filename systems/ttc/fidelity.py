"""Simulator fidelity in one command: calibrate this CPU, then run ``experiment=lbs_fidelity``.

    python -m systems.ttc.fidelity [recalibrate=false] [any run.py override ...]

Writes ``results/sweeps/lbs_fidelity/fidelity.md`` (per-configuration errors, MAPE of end-to-end
time and of bytes) and prints the summary. Bytes must match exactly (the simulator executes the
same plans); time error comes from the cost model.
"""
from __future__ import annotations

import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def main(argv=None) -> int:
    args = list(sys.argv[1:] if argv is None else argv)
    recal = "recalibrate=false" not in args
    args = [a for a in args if not a.startswith("recalibrate=")]
    prof = ROOT / "conf" / "hardware" / "cpu-calibrated.yaml"
    if recal or not prof.exists():
        rc = subprocess.call([sys.executable, "-m", "harness.calibrate", "hardware=cpu"], cwd=ROOT)
        if rc:
            return rc
    return subprocess.call([sys.executable, "run.py", "-m", "experiment=lbs_fidelity", "hardware=cpu-calibrated", *args], cwd=ROOT)


if __name__ == "__main__":
    sys.exit(main())
