#!/usr/bin/env python3
"""Compiles one zoo model under several parallel configurations and runs each
against PyTorch's output (the model directory's output.*.npy).

  check_model.py PCC PCC_RUN MODEL_DIR OUT_DIR CONFIG...

CONFIG is `1` (one device), `tpN`, `ppN`, `tpNxppM`, optionally followed by
`mK` for K micro-batches (`pp2m2`); an argument starting with `--` is a pcc
flag given to every compile (and named in each line). Prints one line per
configuration:

  <family>/<exporter> <config>: matches (max |diff| ...)
  <family>/<exporter> <config>: FAILED ...   (then the tool's output)

and exits non-zero if any configuration failed. The inputs, their order and
the symbolic dimensions come from the directory's manifest.json.
"""
import json
import os
import re
import subprocess
import sys


def parse_config(config):
    m = re.fullmatch(r"(?:1|tp(\d+)|pp(\d+)|tp(\d+)xpp(\d+))(?:m(\d+))?", config)
    if not m:
        sys.exit(f"check_model.py: bad configuration '{config}'")
    tp = int(m.group(1) or m.group(3) or 1)
    pp = int(m.group(2) or m.group(4) or 1)
    flags = []
    if tp > 1:
        flags.append(f"--tp={tp}")
    if pp > 1:
        flags.append(f"--pp={pp}")
    if m.group(5):
        flags.append(f"--microbatches={m.group(5)}")
    return flags, tp * pp


def main():
    if len(sys.argv) < 6:
        sys.exit(__doc__)
    pcc, pcc_run, model_dir, out_dir = sys.argv[1:5]
    configs = [a for a in sys.argv[5:] if not a.startswith("--")]
    extra = [a for a in sys.argv[5:] if a.startswith("--")]
    manifest = json.load(open(os.path.join(model_dir, "manifest.json")))
    name = f"{manifest['family']}/{manifest['exporter']}"
    if extra:
        name += " " + " ".join(extra)
    inputs = []
    dims = {}
    for i in manifest["inputs"]:
        inputs += ["--input", os.path.join(model_dir, f"input.{i['name']}.npy")]
        for d, size in zip(i["shape"], manifest["example_shapes"][i["name"]]):
            if isinstance(d, str):
                dims[d] = size
    dim_flags = [f"--dim={k}={v}" for k, v in sorted(dims.items())]
    (output,) = [o["name"] for o in manifest["outputs"]]
    expect = os.path.join(model_dir, f"output.{output}.npy")
    os.makedirs(out_dir, exist_ok=True)
    failed = 0
    for config in configs:
        flags, ranks = parse_config(config)
        lib = os.path.join(out_dir, f"{manifest['family']}.{manifest['exporter']}.{config}.so")
        compile_cmd = [pcc, os.path.join(model_dir, "model.onnx"), *dim_flags, *flags, *extra,
                       "-o", lib]
        run_cmd = [pcc_run, "-n", str(ranks), lib, *inputs, "--expect", expect]
        for what, cmd in (("compile", compile_cmd), ("run", run_cmd)):
            r = subprocess.run(cmd, capture_output=True, text=True)
            text = r.stdout + r.stderr
            if r.returncode != 0 or (what == "run" and ": matches" not in text):
                print(f"{name} {config}: FAILED to {what}: {' '.join(cmd)}")
                print(text)
                failed += 1
                break
        else:
            diff = re.search(r"max \|diff\| ([^,\s]+)", text)
            print(f"{name} {config}: matches (max |diff| {diff.group(1) if diff else '?'})")
    sys.exit(1 if failed else 0)


if __name__ == "__main__":
    main()
