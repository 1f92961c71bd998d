#!/usr/bin/env python3
"""Where the suite trains each combination of the parallel training matrices.

  dp (issue 15): every bundled model (the MLP, both encoders, the GPT, the
      training-mode ResNet-18) at dp 2 and 4, ZeRO 0-3, tp 1 and 2, and
      with --sp at tp 2 for the models with a sequence;
  pp (issue 16): both encoders and the GPT at pp 2 and 4 under each
      schedule (gpipe, 1f1b, interleaved, zb-h1), and at pp 2 under each
      schedule with tp 2, and with dp 2 at ZeRO 0-3.

Each must train PyTorch's 20 AdamW steps in the suite. This reads the
parity runs of test/Training/*.test (parity.py command lines, DEFINE
substitutions expanded), prints the test file of each combination, and
exits non-zero when one is missing.

    python3 scripts/parity-matrix.py dp|pp [test/Training] [--quiet]
"""
import glob
import itertools
import os
import re
import sys

DP_MODELS = ["mlp", "transformer_postnorm", "transformer_prenorm", "gpt",
             "resnet18_train"]
NO_SEQUENCE = {"mlp", "resnet18_train"}
PP_MODELS = ["transformer_postnorm", "transformer_prenorm", "gpt"]
SCHEDULES = ["gpipe", "1f1b", "interleaved", "zb-h1"]


def parity_runs(directory):
    """(model, pp, schedule, dp, zero, tp, sp, optimizer) -> test file, for
    every parity.py run."""
    found = {}
    for path in sorted(glob.glob(os.path.join(directory, "*.test"))):
        defines = {}
        for line in open(path):
            line = line.strip()
            m = re.match(r"DEFINE: %\{(\w+)\} = (.*)", line)
            if m:
                defines[m.group(1)] = m.group(2)
                continue
            if not line.startswith("RUN:"):
                continue
            cmd = line[4:]
            for name, value in defines.items():
                cmd = cmd.replace("%{" + name + "}", value)
            if "parity.py" not in cmd:
                continue

            def arg(name, default):
                m = re.search(r"--" + name + r"[ =]\"?([^\s\"]+)", cmd)
                return m.group(1) if m else default

            pp = int(arg("pp", "1"))
            schedule = ("interleaved" if "--pp-chunks" in cmd else
                        arg("schedule", "1f1b")) if pp > 1 else "-"
            key = (arg("model", "?"), pp, schedule, int(arg("dp", "1")),
                   int(arg("zero", "0")), int(arg("tp", "1")),
                   "--sp" in cmd.split(), arg("optimizer", "?"))
            found.setdefault(key, os.path.basename(path))
    return found


def matrix(which):
    """The combinations as (model, pp, schedule, dp, zero, tp, sp)."""
    if which == "dp":
        for model in DP_MODELS:
            for dp, zero, tp in itertools.product([2, 4], [0, 1, 2, 3],
                                                  [1, 2]):
                for sp in ([False, True]
                           if tp == 2 and model not in NO_SEQUENCE
                           else [False]):
                    yield (model, 1, "-", dp, zero, tp, sp)
        return
    for model in PP_MODELS:
        for schedule in SCHEDULES:
            for pp in [2, 4]:
                yield (model, pp, schedule, 1, 0, 1, False)
            yield (model, 2, schedule, 1, 0, 2, False)
            for zero in [0, 1, 2, 3]:
                yield (model, 2, schedule, 2, zero, 1, False)


def main():
    args = [a for a in sys.argv[1:] if a != "--quiet"]
    quiet = "--quiet" in sys.argv[1:]
    if not args or args[0] not in ("dp", "pp"):
        sys.exit(__doc__.strip())
    here = os.path.dirname(os.path.abspath(__file__))
    directory = args[1] if len(args) > 1 else os.path.join(
        here, "..", "test", "Training")
    found = parity_runs(directory)
    total = missing = 0
    for model, pp, schedule, dp, zero, tp, sp in matrix(args[0]):
        total += 1
        where = found.get((model, pp, schedule, dp, zero, tp, sp, "adamw"))
        missing += where is None
        if not quiet or where is None:
            print("%-22s %s dp=%d zero=%d tp=%d%s  %s" %
                  (model, "pp=%d %-11s" % (pp, schedule) if pp > 1 else "",
                   dp, zero, tp, " --sp" if sp else "", where or "MISSING"),
                  flush=True)
    print("%d of %d combinations trained in the suite" %
          (total - missing, total))
    return 1 if missing else 0


if __name__ == "__main__":
    sys.exit(main())
