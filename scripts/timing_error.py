"""Print the timing model's error against recorded RTL traces (``scripts/record_traces.py``).

Usage, from the repository root with ``PYTHONPATH`` as in ``scripts/env.sh``::

    python scripts/timing_error.py tests/model/traces

One line per trace: RTL cycles, estimated cycles, the error of the total and per engine
(summed task cycles; in brackets the largest error of one task of at least 200 cycles).
"""

import json
import sys
from pathlib import Path

from npu_model.timing import estimate, trace_error
from npu_spec.program import load


def main(argv):
    folder = Path(argv[0])
    print(f"{'trace':<26} {'tasks':>5} {'RTL':>8} {'model':>8} {'total':>7}  "
          f"{'NE':>15} {'PE':>15} {'DMA':>15}")
    worst = {"total": 0.0}
    for path in sorted(folder.glob("*.json")):
        rec = json.loads(path.read_text())
        est = estimate(load(str(path.with_suffix(".npu"))), latency=rec["latency"])
        err = trace_error(est, rec["tasks"], rec["cycles"])
        cells = []
        for engine in ("NEURAL", "PLANAR", "DMA"):
            if engine in err:
                total, one, _ = err[engine]
                cells.append(f"{total:+6.1%} ({one:4.0%})")
                worst[engine] = max(worst.get(engine, 0.0), abs(total))
            else:
                cells.append("-")
        worst["total"] = max(worst["total"], abs(err["total"]))
        print(f"{path.stem:<26} {len(rec['tasks']):>5} {rec['cycles']:>8} {est.cycles:>8} "
              f"{err['total']:+7.1%}  " + " ".join(f"{c:>15}" for c in cells))
    print("largest |error|: " + ", ".join(f"{k} {v:.1%}" for k, v in worst.items()))


if __name__ == "__main__":
    main(sys.argv[1:])
