#!/usr/bin/env python3
"""Reads two `pcc plan` outputs of the same plan at 1 and N micro-batches
(the batch's rows split N ways) and checks the cost model's micro-batch
term: the work on weight-sized buffers is paid once per micro-batch (N
times the one micro-batch's), and the N-micro-batch plan is predicted
slower."""

import re
import sys

LINE = re.compile(r"chosen: .*--microbatches=(\d+).*\n\s+predicted step ([0-9.]+) s"
                  r" = .*weight-sized work ([0-9.]+)\)")


def read(path):
    m = LINE.search(open(path).read())
    if not m:
        sys.exit(f"check_grad_share.py: no chosen plan in {path}")
    return int(m.group(1)), float(m.group(2)), float(m.group(3))


def main():
    m1, step1, grad1 = read(sys.argv[1])
    mn, stepn, gradn = read(sys.argv[2])
    if m1 != 1 or mn <= 1 or grad1 <= 0:
        sys.exit(f"check_grad_share.py: expected 1 and N > 1 micro-batches "
                 f"with a positive figure, got {m1} ({grad1}) and {mn}")
    ratio = gradn / grad1
    print(f"weight-sized work: {mn} micro-batches pay {ratio:.1f}x "
          f"one micro-batch's")
    if abs(ratio - mn) > 0.02 * mn + 2e-6 / grad1:
        sys.exit("check_grad_share.py: not paid once per micro-batch")
    if stepn <= step1:
        sys.exit(f"check_grad_share.py: {mn} micro-batches predicted at "
                 f"{stepn} s, not slower than one at {step1} s")
    print(f"step: {mn} micro-batches of one row predicted slower than one of "
          f"{mn} rows")


if __name__ == "__main__":
    main()
