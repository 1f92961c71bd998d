#!/usr/bin/env python3
"""Reads `pcc plan` progress lines on standard input and checks that every
compiled plan's predicted peak is never under its compiled peak and at most
`--over` above it (issue 35: "memory never under, at most 5% over").
Prints one line per plan and exits non-zero on the first miss."""

import argparse
import re
import sys

UNITS = {"MiB": 2**20, "GiB": 2**30}


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--over", type=float, default=0.05)
    ap.add_argument("--expect", type=int, required=True,
                    help="how many compiled plans the input must hold")
    args = ap.parse_args()
    pattern = re.compile(
        r"compiled (--tp=\S+ --pp=\S+).*?: peak ([0-9.]+) (MiB|GiB) per rank "
        r"\(predicted ([0-9.]+) (MiB|GiB)\)")
    seen = 0
    ok = True
    for line in sys.stdin:
        m = pattern.search(line)
        if not m:
            continue
        seen += 1
        compiled = float(m.group(2)) * UNITS[m.group(3)]
        predicted = float(m.group(4)) * UNITS[m.group(5)]
        ratio = predicted / compiled - 1
        # The figures are printed to 0.01: a tie within that is no miss.
        under = predicted < compiled - 0.006 * UNITS[m.group(3)]
        verdict = "under" if under else ("over" if ratio > args.over else "ok")
        print(f"{verdict}: {m.group(1)}... predicted {ratio:+.2%}")
        ok = ok and verdict == "ok"
    if seen != args.expect:
        print(f"check_figures.py: {seen} compiled plans, expected {args.expect}")
        return 1
    print("check_figures.py: " + ("PASS" if ok else "FAIL"))
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
