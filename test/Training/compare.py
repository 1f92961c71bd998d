#!/usr/bin/python3
"""Compare a pcc training run with a PyTorch reference (numpy only).

    compare.py --ref-losses R.csv --losses L.csv [--rtol 1e-5] [--atol 1e-7]
               [--grad-norm-rtol 1e-4]
               [--ref-weights R.safetensors --weights W.safetensors
                --wrtol 1e-4 --watol 1e-6]

Losses: both CSV files have a header naming their columns (the reference:
`step,loss,grad_norm`; pcc's log: `step,loss,...`). Rows are matched by
step number, columns by name. Every reference step must be in the log, with
|loss - ref| <= rtol * |ref| + atol. grad_norm is compared the same way
(with --grad-norm-rtol) when both files have that column (--steps N: the
first N steps only, and no weights); a step whose
gradients overflowed under fp16 loss scaling (grad_norm inf or nan on both
sides) matches. When both have a `loss_scale` column (fp16's dynamic loss
scaling), each step's scale must be equal: the same steps overflowed and
were skipped.

Weights: every tensor of the reference must be in the run's file with the
same shape and numpy.allclose(weight, ref, rtol=wrtol, atol=watol). A tensor
on one side only is an error, except the run's optimizer state: tensors
named `<name>@...` are ignored. Elements the reference lists in its
`pcc.exclude` metadata (JSON {name: [[start, stop], ...]}, flat index
ranges; --exclude-from takes them from another file, the PyTorch reference
when two pcc runs are compared) are not compared unless --no-exclude:
make_reference.py marks the
elements whose gradient is zero in exact arithmetic but rounding noise in
float32 (attention's key bias), which Adam turns into arbitrary updates.
A tied weight the exporter wrote twice (`pcc.tied` metadata: {copy: {"of":
first, "transposed": bool}}) may be absent from the run's file when its
first copy is there (pcc's importer stores it once); then the first is
compared in its place.

Prints each step's and each weight's differences; exits 0 when everything
matches, 1 naming the first failing step or weight, 2 on bad input.
"""

import argparse
import json
import math
import struct
import sys

import numpy as np

_DTYPES = {
    "F64": "<f8", "F32": "<f4", "F16": "<f2", "I64": "<i8", "I32": "<i4",
    "I16": "<i2", "I8": "i1", "U8": "u1", "BOOL": "?",
}


class InputError(Exception):
    pass


def read_safetensors(path, with_metadata=False):
    """{name: numpy array} of a .safetensors file, in file order (and its
    __metadata__ dict with with_metadata)."""
    try:
        with open(path, "rb") as f:
            data = f.read()
    except OSError as e:
        raise InputError("cannot read %s: %s" % (path, e.strerror))
    if len(data) < 8:
        raise InputError("%s: not a safetensors file (too short)" % path)
    (n,) = struct.unpack("<Q", data[:8])
    if 8 + n > len(data):
        raise InputError("%s: header length %d runs past the end" % (path, n))
    try:
        header = json.loads(data[8:8 + n].decode("utf-8"))
    except (UnicodeDecodeError, ValueError) as e:
        raise InputError("%s: bad header: %s" % (path, e))
    body = memoryview(data)[8 + n:]
    out = {}
    for name, info in header.items():
        if name == "__metadata__":
            continue
        dt = info.get("dtype")
        shape = tuple(info.get("shape", ()))
        lo, hi = info.get("data_offsets", (0, 0))
        if hi > len(body) or lo > hi:
            raise InputError("%s: tensor '%s' lies outside the file" % (path, name))
        raw = body[lo:hi]
        if dt == "BF16":
            a = (np.frombuffer(raw, dtype="<u2").astype(np.uint32) << 16).view(np.float32)
        elif dt in _DTYPES:
            a = np.frombuffer(raw, dtype=_DTYPES[dt])
        else:
            raise InputError("%s: tensor '%s' has unsupported dtype %s" % (path, name, dt))
        if a.size != int(np.prod(shape, dtype=np.int64)):
            raise InputError("%s: tensor '%s' holds %d elements, its shape %s needs %d"
                             % (path, name, a.size, list(shape), int(np.prod(shape))))
        out[name] = a.reshape(shape)
    if with_metadata:
        meta = header.get("__metadata__") or {}
        return out, meta if isinstance(meta, dict) else {}
    return out


def read_csv(path):
    """(columns, {step: {column: float}}) of a CSV log with a header."""
    try:
        with open(path) as f:
            lines = [l.strip() for l in f]
    except OSError as e:
        raise InputError("cannot read %s: %s" % (path, e.strerror))
    lines = [l for l in lines if l and not l.startswith("#")]
    if not lines:
        raise InputError("%s is empty" % path)
    cols = [c.strip() for c in lines[0].split(",")]
    if "step" not in cols or "loss" not in cols:
        raise InputError("%s: the header '%s' has no 'step' and 'loss' columns"
                         % (path, lines[0]))
    rows = {}
    for i, line in enumerate(lines[1:], start=2):
        cells = [c.strip() for c in line.split(",")]
        if len(cells) != len(cols):
            raise InputError("%s:%d: %d fields, the header has %d"
                             % (path, i, len(cells), len(cols)))
        row = {}
        for c, v in zip(cols, cells):
            try:
                row[c] = float(v)
            except ValueError:
                row[c] = v  # a non-numeric column; never compared
        step = row["step"]
        if not isinstance(step, float) or step != int(step):
            raise InputError("%s:%d: step '%s' is not an integer" % (path, i, cells[0]))
        if int(step) in rows:
            raise InputError("%s:%d: step %d appears twice" % (path, i, int(step)))
        rows[int(step)] = row
    return cols, rows


def rel(a, b):
    d = abs(a - b)
    return d / abs(b) if b != 0 else (0.0 if d == 0 else math.inf)


def close(a, b, rtol, atol):
    return isinstance(a, float) and not math.isnan(a) and abs(a - b) <= rtol * abs(b) + atol


def compare_losses(args, failures):
    rcols, ref = read_csv(args.ref_losses)
    lcols, got = read_csv(args.losses)
    gn = "grad_norm" in rcols and "grad_norm" in lcols
    scaled = "loss_scale" in rcols and "loss_scale" in lcols
    print("losses: %s vs reference %s (rtol %g, atol %g%s)" % (
        args.losses, args.ref_losses, args.rtol, args.atol,
        ", grad_norm rtol %g" % args.grad_norm_rtol if gn else
        "; grad_norm not compared: %s has no grad_norm column"
        % (args.ref_losses if "grad_norm" not in rcols else args.losses)))
    print("%5s %-22s %-22s %-10s%s" % ("step", "loss (ref)", "loss", "rel diff",
                                      "  grad_norm rel diff" if gn else ""))
    max_l = max_g = 0.0
    for step in sorted(ref):
        if args.steps is not None and step > args.steps:
            break
        r = ref[step]
        if step not in got:
            print("%5d %-22r %-22s" % (step, r["loss"], "(missing)"))
            failures.append("step %d: missing from %s" % (step, args.losses))
            continue
        g = got[step]
        dl = rel(g["loss"], r["loss"]) if isinstance(g["loss"], float) else math.inf
        dl = math.inf if math.isnan(dl) else dl
        max_l = max(max_l, dl)
        bad = []
        if not close(g["loss"], r["loss"], args.rtol, args.atol):
            bad.append("loss %r vs reference %r (rel diff %.3g > rtol %g)"
                       % (g["loss"], r["loss"], dl, args.rtol))
        extra = ""
        overflowed = all(isinstance(x.get("grad_norm"), float) and
                         not math.isfinite(x["grad_norm"]) for x in (g, r))
        if gn and overflowed:
            extra = "  overflow (skipped)"
        elif gn:
            dg = rel(g["grad_norm"], r["grad_norm"]) \
                if isinstance(g["grad_norm"], float) else math.inf
            dg = math.inf if math.isnan(dg) else dg
            max_g = max(max_g, dg)
            extra = "  %.3e" % dg
            if not close(g["grad_norm"], r["grad_norm"], args.grad_norm_rtol, args.atol):
                bad.append("grad_norm %r vs reference %r (rel diff %.3g > rtol %g)"
                           % (g["grad_norm"], r["grad_norm"], dg, args.grad_norm_rtol))
        if scaled and g["loss_scale"] != r["loss_scale"]:
            bad.append("loss scale %r vs reference %r (a step overflowed on "
                       "one side only)" % (g["loss_scale"], r["loss_scale"]))
        print("%5d %-22r %-22r %.3e%s%s" % (step, r["loss"], g["loss"], dl, extra,
                                          "  FAIL" if bad else ""))
        for b in bad:
            failures.append("step %d: %s" % (step, b))
    extra_steps = sorted(s for s in set(got) - set(ref)
                         if args.steps is None or s <= args.steps)
    if extra_steps:
        print("note: %s has steps the reference lacks (%d..%d), not compared"
              % (args.losses, extra_steps[0], extra_steps[-1]))
    print("max loss rel diff %.3e%s" % (max_l, ", max grad_norm rel diff %.3e" % max_g
                                        if gn else ""))


def compare_weights(args, failures):
    ref, meta = read_safetensors(args.ref_weights, with_metadata=True)
    got = read_safetensors(args.weights)
    try:
        tied = json.loads(meta.get("pcc.tied", "{}"))
    except ValueError as e:
        raise InputError("%s: bad pcc.tied metadata: %s" % (args.ref_weights, e))
    exclude = {}
    source = args.ref_weights
    if args.exclude_from:
        # Two pcc runs compared: the PyTorch reference says which elements
        # are noise.
        source = args.exclude_from
        meta = read_safetensors(source, with_metadata=True)[1]
    if "pcc.exclude" in meta and not args.no_exclude:
        try:
            exclude = json.loads(meta["pcc.exclude"])
        except ValueError as e:
            raise InputError("%s: bad pcc.exclude metadata: %s" % (source, e))
    print("weights: %s vs reference %s (rtol %g, atol %g)"
          % (args.weights, args.ref_weights, args.wrtol, args.watol))
    if exclude:
        print("not compared (the reference marks their gradient as float32 rounding "
              "noise, zero in exact arithmetic; --no-exclude compares them): %s"
              % ", ".join("%s%s" % (n, "".join("[%d:%d]" % tuple(r) for r in rs))
                          for n, rs in exclude.items()))
    width = max([len(n) for n in ref] + [6])
    print("%-*s %-12s %-12s" % (width, "weight", "max abs", "max rel"))
    worst = (0.0, None)
    for name, r in ref.items():
        if name not in got and name in tied and tied[name]["of"] in got:
            # A tied weight's second copy, stored once by pcc: compare the
            # first (it holds the same tensor).
            src = tied[name]["of"]
            g = got[src].T if tied[name]["transposed"] else got[src]
            print("%-*s (tied: '%s'%s, not stored separately)"
                  % (width, name, src, " transposed" if tied[name]["transposed"] else ""))
        elif name not in got:
            print("%-*s (missing)" % (width, name))
            failures.append("weight '%s': missing from %s" % (name, args.weights))
            continue
        else:
            g = got[name]
        if g.shape != r.shape:
            print("%-*s shape %s, reference %s" % (width, name, list(g.shape), list(r.shape)))
            failures.append("weight '%s': shape %s, reference %s"
                            % (name, list(g.shape), list(r.shape)))
            continue
        g64, r64 = g.astype(np.float64), r.astype(np.float64)
        if name in exclude:
            # Excluded elements (flat index ranges) compare equal.
            g64, r64 = g64.reshape(-1).copy(), r64.reshape(-1).copy()
            for lo, hi in exclude[name]:
                g64[lo:hi] = r64[lo:hi]
            g64, r64 = g64.reshape(r.shape), r64.reshape(r.shape)
        d = np.abs(g64 - r64)
        nan = bool(np.isnan(g64).any() and not np.isnan(r64).any())
        dmax = float(np.nanmax(d)) if d.size and not np.isnan(d).all() else 0.0
        with np.errstate(divide="ignore", invalid="ignore"):
            rd = np.where(d == 0, 0.0, d / np.abs(r64))
        rmax = float(np.nanmax(rd)) if rd.size and not np.isnan(rd).all() else 0.0
        if nan:
            dmax = rmax = math.inf
        ok = not nan and bool(np.allclose(g64, r64, rtol=args.wrtol, atol=args.watol))
        if not ok and d.size:
            # Where the tolerance is exceeded the most.
            excess = d - (args.watol + args.wrtol * np.abs(r64))
            excess = np.where(np.isnan(excess), np.inf, excess)
            idx = np.unravel_index(int(np.argmax(excess)), d.shape)
            failures.append(
                "weight '%s': max abs diff %.3g, max rel diff %.3g; at %s %r vs "
                "reference %r (rtol %g, atol %g)" % (
                    name, dmax, rmax, list(int(i) for i in idx), float(g64[idx]),
                    float(r64[idx]), args.wrtol, args.watol))
        if dmax >= worst[0]:
            worst = (dmax, name)
        print("%-*s %.3e    %.3e%s" % (width, name, dmax, rmax, "" if ok else "  FAIL"))
    extras = [n for n in got if n not in ref and "@" not in n]
    for n in extras:
        failures.append("weight '%s': in %s but not in the reference" % (n, args.weights))
    ignored = sum(1 for n in got if n not in ref and "@" in n)
    print("%d weights compared%s%s" % (
        len(ref), ", largest abs diff %.3e in '%s'" % worst if worst[1] else "",
        ", %d optimizer-state tensors (name@...) ignored" % ignored if ignored else ""))


def main(argv):
    ap = argparse.ArgumentParser(
        description="Compare a pcc training run with a PyTorch reference.")
    ap.add_argument("--ref-losses", help="reference losses CSV (step,loss,grad_norm)")
    ap.add_argument("--losses", help="pcc loss log CSV (step,loss,...)")
    ap.add_argument("--rtol", type=float, default=1e-5, help="loss relative tolerance")
    ap.add_argument("--atol", type=float, default=1e-7, help="loss absolute tolerance")
    ap.add_argument("--grad-norm-rtol", type=float, default=1e-4,
                    help="grad_norm relative tolerance")
    ap.add_argument("--ref-weights", help="reference final weights (.safetensors)")
    ap.add_argument("--weights", help="pcc's final weights (.safetensors)")
    ap.add_argument("--wrtol", type=float, default=1e-4, help="weight relative tolerance")
    ap.add_argument("--watol", type=float, default=1e-6, help="weight absolute tolerance")
    ap.add_argument("--steps", type=int, default=None, metavar="N",
                    help="compare the losses of the first N steps only, and "
                    "not the final weights (a chaotic run: one whose 16-bit "
                    "runs leave their noise bound after step N)")
    ap.add_argument("--exclude-from", metavar="REF.safetensors",
                    help="take the pcc.exclude metadata from this file (the "
                    "PyTorch reference) instead of --ref-weights: two pcc "
                    "runs compared with each other")
    ap.add_argument("--no-exclude", action="store_true",
                    help="also compare the elements the reference's pcc.exclude "
                    "metadata marks (gradient that is float32 rounding noise)")
    args = ap.parse_args(argv)
    if (args.ref_losses is None) != (args.losses is None):
        ap.error("--ref-losses and --losses go together")
    if (args.ref_weights is None) != (args.weights is None):
        ap.error("--ref-weights and --weights go together")
    if args.ref_losses is None and args.ref_weights is None:
        ap.error("nothing to compare: give --ref-losses/--losses and/or "
                 "--ref-weights/--weights")
    failures = []
    try:
        if args.ref_losses:
            compare_losses(args, failures)
        if args.ref_weights and args.steps is None:
            compare_weights(args, failures)
        elif args.ref_weights:
            print("weights not compared: the comparison stops at step %d"
                  % args.steps)
    except InputError as e:
        print("compare.py: error: %s" % e, file=sys.stderr)
        return 2
    if failures:
        print("compare.py: FAIL (%d mismatches); first: %s" % (len(failures), failures[0]),
              file=sys.stderr)
        return 1
    print("compare.py: PASS")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
