#!/usr/bin/env python3
"""The plan search's memory figure against the compiled library's analysis.

Runs `pcc plan` for a model, a rank count and a memory per rank, lists every
plan it prices as fitting, then compiles each (its flags fixed, `--top=1
--plan-check=1`) and prints the search's figure, the library's analysis
(which pcc-run's measured high-water mark matches: bench/plan_validation.py
measures it) and the error, worst first. No PyTorch, no runs: a GPT-2 124M
sweep on 4 ranks takes about a minute.

    python3 bench/plan_memory_check.py --model ~/.cache/pcc/bench/gpt2/model.onnx \\
        --devices 4 --device-memory 3GiB --machine cpu4.json
"""

import argparse
import os
import re
import subprocess
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
ROW = re.compile(r"\s+(\d+)\s+[\d.]+\s+\S+\s+[\d.]+ \w+\s+\S+(?: \w+)?\s+\S+\s+\S+ \w+\s+(--tp.*?)(\s+\(.*)?$")
PEAK = re.compile(r"peak ([\d.]+ \w+) per rank \(predicted ([\d.]+ \w+)\)")


def mib(text):
    value, unit = text.split()
    return float(value) * {"GiB": 1024, "MiB": 1, "KiB": 1 / 1024}[unit]


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", required=True)
    ap.add_argument("--devices", type=int, default=4)
    ap.add_argument("--device-memory", default="3GiB")
    ap.add_argument("--machine", default="")
    ap.add_argument("--pcc-args", default="", help="more flags for pcc plan")
    ap.add_argument("--bin", default=os.path.join(ROOT, "build", "bin"))
    args = ap.parse_args()
    pcc = os.path.join(args.bin, "pcc")
    base = [pcc, "plan", args.model, "--train", "--devices=%d" % args.devices,
            "--device-memory=" + args.device_memory] + args.pcc_args.split()
    if args.machine:
        base.append("--machine=" + args.machine)
    out = subprocess.run(base + ["--top=10000", "--plan-check=0"],
                         stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    if out.returncode:
        sys.exit(out.stdout + out.stderr)
    plans = [m.group(2).split() for m in map(ROW.match, out.stdout.splitlines()) if m]
    print("%d plans" % len(plans), flush=True)
    rows = []
    for flags in plans:
        # `pcc plan` takes the plan's dimensions; its cut it finds again.
        fixed = [f for f in flags if not f.startswith("--pp-cuts")]
        # A plan without --sp is one without it (absent, the search would
        # choose it again).
        if "--sp" not in fixed:
            fixed.append("--sp=false")
        o = subprocess.run(base + ["--top=1", "--plan-check=1"] + fixed,
                           stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
        m = PEAK.search(o.stdout)
        if not m:
            print("compile failed: %s\n%s" % (" ".join(flags), o.stdout[-500:]))
            continue
        compiled, predicted = mib(m.group(1)), mib(m.group(2))
        rows.append((predicted / compiled - 1, predicted, compiled, flags))
    rows.sort(key=lambda r: -abs(r[0]))
    print("| search MiB | compiled MiB | error | plan |\n|---|---|---|---|")
    for err, predicted, compiled, flags in rows:
        print("| %.1f | %.1f | %+.1f%% | `%s` |" % (predicted, compiled, 100 * err, " ".join(flags)))
    if rows:
        errs = [r[0] for r in rows]
        exact = sum(1 for e in errs if abs(e) < 0.0005)
        print("\n%d plans: %+.1f%% to %+.1f%%, %d exact, %d under" % (
            len(rows), 100 * min(errs), 100 * max(errs), exact, sum(1 for e in errs if e < -0.0005)))


if __name__ == "__main__":
    main()
