"""Checks a pcc-run --trace file: counts its events and that, on every
rank, each micro-batch is computed after it was received.

    check_trace.py trace.json pipeline_ranks microbatches [chunks]
"""
import json
import sys

trace = json.load(open(sys.argv[1]))
p, m = int(sys.argv[2]), int(sys.argv[3])
v = int(sys.argv[4]) if len(sys.argv) > 4 else 1
events = [e for e in trace["traceEvents"] if e["ph"] == "X"]
ranks = {e["tid"] for e in events}
by = lambda cat: [e for e in events if e["cat"] == cat]
print(f"ranks {len(ranks)}, compute events {len(by('compute'))}, "
      f"sends {len(by('send'))}, receives {len(by('recv'))}, "
      f"idle intervals {len(by('idle'))}")
ok = len(by("compute")) == p * v * m
for recv in by("recv"):
    mb, stage, tid = (recv["args"]["microbatch"], recv["args"]["stage"],
                      recv["tid"])
    compute = [e for e in by("compute")
               if e["tid"] == tid and e["args"]["microbatch"] == mb
               and e["args"]["stage"] == stage]
    ok = ok and len(compute) == 1 and compute[0]["ts"] >= recv["ts"] + recv["dur"] - 1e-3
for e in events:
    ok = ok and e["dur"] >= 0 and e["ts"] >= 0
print("every micro-batch computed on every stage after it arrived" if ok
      else "ORDER BROKEN")
