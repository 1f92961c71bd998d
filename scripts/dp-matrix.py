#!/usr/bin/env python3
"""Where the suite trains each combination of issue 15's matrix.

Every bundled model (the MLP, both encoders, the GPT and the training-mode
ResNet-18) at dp 2 and 4, ZeRO 0-3, tp 1 and 2, and with --sp at tp 2 for
the models with a sequence, must train PyTorch's 20 AdamW steps in the
suite. This reads the parity runs of test/Training/*.test (parity.py
command lines, DEFINE substitutions expanded), prints the test file of each
combination, and exits non-zero when one is missing.

    python3 scripts/dp-matrix.py [test/Training] [--quiet]
"""
import glob
import itertools
import os
import re
import sys

MODELS = ["mlp", "transformer_postnorm", "transformer_prenorm", "gpt",
          "resnet18_train"]
NO_SEQUENCE = {"mlp", "resnet18_train"}


def parity_runs(directory):
    """(model, dp, zero, tp, sp, optimizer) -> test file, for every
    parity.py run without pipelining."""
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
            if "parity.py" not in cmd or "--pp" in cmd:
                continue

            def arg(name, default):
                m = re.search(r"--" + name + r"[ =](\S+)", cmd)
                return m.group(1) if m else default

            key = (arg("model", "?"), int(arg("dp", "1")),
                   int(arg("zero", "0")), int(arg("tp", "1")),
                   "--sp" in cmd.split(), arg("optimizer", "?"))
            found.setdefault(key, os.path.basename(path))
    return found


def main():
    args = [a for a in sys.argv[1:] if a != "--quiet"]
    quiet = "--quiet" in sys.argv[1:]
    here = os.path.dirname(os.path.abspath(__file__))
    directory = args[0] if args else os.path.join(here, "..", "test",
                                                  "Training")
    found = parity_runs(directory)
    total = missing = 0
    for model in MODELS:
        for dp, zero, tp in itertools.product([2, 4], [0, 1, 2, 3], [1, 2]):
            for sp in ([False, True] if tp == 2 and model not in NO_SEQUENCE
                       else [False]):
                total += 1
                where = found.get((model, dp, zero, tp, sp, "adamw"))
                missing += where is None
                if not quiet or where is None:
                    print("%-22s dp=%d zero=%d tp=%d%s  %s" %
                          (model, dp, zero, tp, " --sp" if sp else "     ",
                           where or "MISSING"))
    print("%d of %d combinations trained in the suite" % (total - missing,
                                                          total))
    return 1 if missing else 0


if __name__ == "__main__":
    sys.exit(main())
