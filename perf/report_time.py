"""Time of ``mlmt-bench report`` (it runs at the end of every experiment): the whole comparison
(comparison.md, acc_vs_tokens.png, index.html) against the HTML page alone, on real run or
experiment directories.

In one process, after one untimed warm-up report (imports, font cache): ``--repeats`` times the
whole :func:`build_comparison`, then ``--repeats`` times :func:`write_html` alone on the same
summary. Prints the median wall and CPU seconds of each, the rest (Markdown + PNG + statistics
+ loading), and the share of the HTML page; ``--json`` writes them.

    python perf/report_time.py RUN_OR_EXPERIMENT_DIR... [--repeats 3] [--json out.json]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

from mlmt_bench.report.compare import build_comparison
from mlmt_bench.report.html import write_html
from mlmt_bench.report.runs import group_runs, load_run


def _timed(fn) -> tuple[float, float]:
    wall, cpu = time.perf_counter(), time.process_time()
    fn()
    return time.perf_counter() - wall, time.process_time() - cpu


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("dirs", nargs="+", type=Path)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--json", type=Path)
    args = ap.parse_args(argv)

    runs = group_runs(args.dirs)
    n_runs = sum(len(v) for v in runs.values())
    with tempfile.TemporaryDirectory(prefix="report-time-") as tmp:
        out = Path(tmp)
        summary = build_comparison(runs, out)  # warm-up
        whole = [_timed(lambda: build_comparison(runs, out)) for _ in range(args.repeats)]
        loaded = {arm: [load_run(p) for p in paths] for arm, paths in runs.items()}
        png = (out / "acc_vs_tokens.png").read_bytes()
        page = [_timed(lambda: write_html(summary, loaded, out / "index.html", acc_png=png))
                for _ in range(args.repeats)]
        size = (out / "index.html").stat().st_size
    res = {"arms": len(runs), "runs": n_runs, "repeats": args.repeats, "index_html_bytes": size,
           "whole_wall_s": statistics.median(w for w, _ in whole),
           "whole_cpu_s": statistics.median(c for _, c in whole),
           "html_wall_s": statistics.median(w for w, _ in page),
           "html_cpu_s": statistics.median(c for _, c in page),
           "loadavg_1m": os.getloadavg()[0]}
    res["html_share_cpu"] = res["html_cpu_s"] / res["whole_cpu_s"]
    print(f"{len(runs)} arms, {n_runs} runs; index.html {size / 1e3:.0f} kB; load average {res['loadavg_1m']:.1f}")
    print(f"{'':24}{'wall s':>8}{'CPU s':>8}")
    print(f"{'whole report':24}{res['whole_wall_s']:8.2f}{res['whole_cpu_s']:8.2f}")
    print(f"{'index.html alone':24}{res['html_wall_s']:8.2f}{res['html_cpu_s']:8.2f}")
    print(f"{'the rest (md, png, stats)':24}{res['whole_wall_s'] - res['html_wall_s']:8.2f}"
          f"{res['whole_cpu_s'] - res['html_cpu_s']:8.2f}")
    print(f"index.html share of the CPU time: {100 * res['html_share_cpu']:.0f}%")
    if args.json:
        args.json.write_text(json.dumps(res, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
