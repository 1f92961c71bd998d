#!/usr/bin/env python3
"""Predicted against measured: the plan search's best plans, each trained.

Runs `pcc plan` for a model, a rank count and a memory per rank, then
compiles every plan it printed, trains a few steps of each with pcc-run on
this machine's CPU ranks, and reports per plan the predicted and measured
step time and peak memory (the search's own figure, the compiled library's
analysis and pcc-run's high-water mark), with the rank correlation of the
times, how far the chosen plan is from the fastest measured one, and the
memory errors (issue 35's validation).

    python3 bench/plan_validation.py --model ~/.cache/pcc/bench/gpt2/model.onnx \\
        --input ~/.cache/pcc/bench/gpt2/work/ids.npy \\
        --labels ~/.cache/pcc/bench/gpt2/work/labels.npy \\
        --devices 4 --device-memory 3GiB --plans 20 --steps 3 [--rounds 3]

With --rounds N every plan runs N times, the plans in turn each round, and
its measured step is the median of its rounds (single runs of four ranks
on two cores vary by up to 25%).

OPENBLAS_CORETYPE is unset for the runs (as the other benches do).
"""

import argparse
import os
import re
import statistics
import subprocess
import sys
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
ROW = re.compile(r"^\s+(\d+)\s+([\d.]+)\s+([\d.]+)%\s+([\d.]+ [MG]iB)\s+"
                 r"([\d.]+ [MG]iB|-)\s+([\d.]+)%\s+([\d.]+ MiB)\s+(--tp=\S+"
                 r"(?: --\S+)*)")


def secs(x):
    """Seconds to print: three decimals, five below 0.1 s (millisecond steps)."""
    return "%.3f" % x if x >= 0.1 else "%.5f" % x


def mibs(x):
    """MiB to print: one decimal, two below 10 MiB, three below 1 (the
    bundled models)."""
    return "%.1f" % x if x >= 10 else "%.2f" % x if x >= 1 else "%.3f" % x


def mib(text):
    value, unit = text.split()
    return float(value) * (1024 if unit == "GiB" else 1)


def spearman(xs, ys):
    def ranks(v):
        order = sorted(range(len(v)), key=lambda i: v[i])
        r = [0.0] * len(v)
        i = 0
        while i < len(order):
            j = i
            while j + 1 < len(order) and v[order[j + 1]] == v[order[i]]:
                j += 1
            for k in range(i, j + 1):
                r[order[k]] = (i + j) / 2.0
            i = j + 1
        return r
    rx, ry = ranks(xs), ranks(ys)
    mx, my = statistics.mean(rx), statistics.mean(ry)
    num = sum((a - mx) * (b - my) for a, b in zip(rx, ry))
    den = (sum((a - mx) ** 2 for a in rx) * sum((b - my) ** 2 for b in ry)) ** 0.5
    return num / den if den else float("nan")


def main():
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", required=True)
    ap.add_argument("--input", required=True)
    ap.add_argument("--labels", required=True)
    ap.add_argument("--devices", type=int, default=4)
    ap.add_argument("--device-memory", default="3GiB")
    ap.add_argument("--plans", type=int, default=20)
    ap.add_argument("--steps", type=int, default=6,
                    help="steps per plan; the median of all but the first two "
                    "(warm-up: first touches of memory, first collectives) is "
                    "its measured step")
    ap.add_argument("--rounds", type=int, default=1,
                    help="run every plan this many times, the plans in turn "
                    "each round (alternating rounds), and take the median "
                    "of its rounds: four ranks on two cores measured one "
                    "library at 2.64 s in one run and 3.42 s in another")
    ap.add_argument("--select", choices=["spread", "top"], default="spread",
                    help="spread: PLANS plans evenly over the ranked list of "
                    "every plan that fits (what a rank correlation tests); "
                    "top: the best PLANS")
    ap.add_argument("--machine", default="",
                    help="--machine for pcc plan (a preset or the file pcc "
                    "calibrate wrote)")
    ap.add_argument("--pcc-args", default="", help="more flags for pcc plan "
                    "and every compile (--dim=..., --precision=fp32, ...)")
    ap.add_argument("--bin", default=os.path.join(ROOT, "build", "bin"))
    ap.add_argument("--work", default="/tmp/pcc-plan-validation")
    args = ap.parse_args()
    os.makedirs(args.work, exist_ok=True)
    pcc = os.path.join(args.bin, "pcc")
    run = os.path.join(args.bin, "pcc-run")
    env = dict(os.environ)
    env.pop("OPENBLAS_CORETYPE", None)
    extra = args.pcc_args.split()

    top = args.plans if args.select == "top" else 10000
    plan_cmd = [pcc, "plan", args.model, "--train", "--devices=%d" % args.devices,
                "--device-memory=" + args.device_memory, "--top=%d" % top,
                "--plan-check=%d" % args.plans] + extra
    if args.machine:
        plan_cmd.append("--machine=" + args.machine)
    print("$ " + " ".join(plan_cmd), flush=True)
    t0 = time.time()
    out = subprocess.run(plan_cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                         text=True, env=env)
    search = time.time() - t0
    if out.returncode:
        sys.exit(out.stdout + out.stderr)
    print(out.stdout, flush=True)
    plans = []
    for line in out.stdout.splitlines():
        m = ROW.match(line)
        if m:
            plans.append({"rank": int(m.group(1)), "pred_s": float(m.group(2)),
                          "pred_mib": mib(m.group(4)),
                          "compiled_mib": None if m.group(5) == "-" else mib(m.group(5)),
                          "flags": m.group(8).split()})
    if args.select == "spread" and len(plans) > args.plans:
        # Evenly over the ranked list, the first and the last included.
        step = (len(plans) - 1) / (args.plans - 1)
        plans = [plans[round(i * step)] for i in range(args.plans)]
    compiled = []
    for p in plans:
        lib = os.path.join(args.work, "plan%d.so" % p["rank"])
        cmd = [pcc, args.model, "--train", "-o", lib] + p["flags"] + extra
        c = subprocess.run(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                           text=True, env=env)
        if c.returncode:
            print("plan %d: compile failed:\n%s" % (p["rank"], c.stdout))
            continue
        p["lib"], p["rounds"], p["meas_mib"] = lib, [], float("nan")
        compiled.append(p)
    for round_ in range(args.rounds):
        for p in compiled:
            if p.get("failed"):
                continue
            cmd = [run, "-n", str(args.devices), p["lib"], "--steps",
                   str(args.steps), "--input", args.input, "--labels",
                   args.labels]
            r = subprocess.run(cmd, stdout=subprocess.PIPE,
                               stderr=subprocess.STDOUT, text=True, env=env)
            if r.returncode:
                print("plan %d: run failed:\n%s" % (p["rank"], r.stdout[-2000:]))
                p["failed"] = True
                continue
            ms = [float(x) for x in re.findall(r"^step \d+/\d+ .* ([\d.]+) ms$",
                                              r.stdout, re.M)]
            peaks = [float(x) for x in
                     re.findall(r"memory high-water ([\d.]+) MiB", r.stdout)]
            # A pipeline's ranks each (rank 0's is the line above): the
            # largest, as the search and the compiled analysis give it.
            for line in re.findall(r"memory high-water per pipeline rank: "
                                   r"([\d., ]+) MiB", r.stdout):
                peaks += [float(x) for x in line.split(",")]
            # The first steps warm up (page faults, first collectives): on 4
            # ranks sharing 2 cores a plan's steps 1-4 measured 3.79, 3.63,
            # 3.06 and 2.88 s.
            p["rounds"].append(
                statistics.median(ms[2:] if len(ms) > 2 else ms) / 1000)
            if peaks:
                p["meas_mib"] = max(peaks)
            p["meas_s"] = statistics.median(p["rounds"])
            print("plan %d%s: predicted %s s, measured %s s; memory "
                  "predicted %s, compiled %s, measured %s MiB  %s" % (
                      p["rank"],
                      " (round %d)" % (round_ + 1) if args.rounds > 1 else "",
                      secs(p["pred_s"]), secs(p["rounds"][-1]),
                      mibs(p["pred_mib"]),
                      "-" if p["compiled_mib"] is None
                      else mibs(p["compiled_mib"]),
                      mibs(p["meas_mib"]), " ".join(p["flags"])), flush=True)
    rows = [p for p in compiled if not p.get("failed") and p["rounds"]]
    if len(rows) < 2:
        sys.exit("plan_validation.py: fewer than two plans ran")
    rho = spearman([p["pred_s"] for p in rows], [p["meas_s"] for p in rows])
    fastest = min(rows, key=lambda p: p["meas_s"])
    chosen = min(rows, key=lambda p: p["rank"])
    print("\n| # | plan | predicted s | measured s | predicted MiB | compiled MiB "
          "| measured MiB |")
    print("|---|---|---|---|---|---|---|")
    for p in rows:
        print("| %d | `%s` | %s | %s | %s | %s | %s |" % (
            p["rank"], " ".join(p["flags"]), secs(p["pred_s"]),
            secs(p["meas_s"]), mibs(p["pred_mib"]),
            "-" if p["compiled_mib"] is None else mibs(p["compiled_mib"]),
            mibs(p["meas_mib"])))
    over = [p["pred_mib"] / p["meas_mib"] - 1 for p in rows]
    comp = [p["compiled_mib"] / p["meas_mib"] - 1 for p in rows
            if p["compiled_mib"] is not None]
    print("\nsearch %.1f s; %d plans ran; Spearman rank correlation of predicted "
          "and measured step time %.2f; the chosen plan (#%d) measured %s s, "
          "the fastest (#%d) %s s (chosen / fastest %.2f)" % (
              search, len(rows), rho, chosen["rank"], secs(chosen["meas_s"]),
              fastest["rank"], secs(fastest["meas_s"]),
              chosen["meas_s"] / fastest["meas_s"]))
    print("search's memory against measured: %+.1f%% to %+.1f%%; the "
          "library's analysis: %s" % (
              100 * min(over), 100 * max(over),
              "%+.1f%% to %+.1f%%" % (100 * min(comp), 100 * max(comp))
              if comp else "-"))


if __name__ == "__main__":
    main()
