#!/usr/bin/env python3
"""Turn a text file into a nanoGPT-style token file for pcc-run --data.

    python3 examples/chargpt/prepare.py [TEXT] [-o gpl3.bin]

The tokens are the file's bytes (vocabulary 256, no tokenizer), written as
little-endian uint16, one after the other: what nanoGPT's prepare.py writes
and what `pcc-run --data FILE --seq S` reads. Default text: the GNU GPL v3
that Debian ships in /usr/share/common-licenses/GPL-3. Plain Python, no numpy.
"""

import argparse
import array
import collections
import sys


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("text", nargs="?", default="/usr/share/common-licenses/GPL-3")
    ap.add_argument("-o", "--output", default="gpl3.bin")
    args = ap.parse_args()

    with open(args.text, "rb") as f:
        data = f.read()
    tokens = array.array("H", iter(data))    # one uint16 per byte
    if sys.byteorder != "little":
        tokens.byteswap()
    with open(args.output, "wb") as f:
        tokens.tofile(f)

    counts = collections.Counter(data)
    shown = "".join(chr(b) if 32 <= b < 127 else "" for b in sorted(counts))
    print("%s: %d tokens (bytes) -> %s (%d bytes, uint16)"
          % (args.text, len(data), args.output, 2 * len(data)))
    print("vocab: 256 (byte ids); %d distinct bytes used, ids %d..%d"
          % (len(counts), min(counts), max(counts)))
    print("printable used: %r; others: %s" % (
        shown, ", ".join("%d" % b for b in sorted(counts)
                         if not 32 <= b < 127)))
    top = ", ".join("%r %d" % (chr(b), n) for b, n in counts.most_common(8))
    print("most common: " + top)


if __name__ == "__main__":
    main()
