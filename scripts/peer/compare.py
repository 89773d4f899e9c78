#!/usr/bin/env python3
"""ftrec `train` against the same DLRM in PyTorch, run in interleaved pairs on one machine.

    scripts/peer/compare.py --install                 # once: PyTorch into target/peer-venv (~5 GB)
    scripts/peer/compare.py --preset small --threads 1 --pairs 3 --steps 300

Each pair runs `ftrec train` and scripts/peer/dlrm.py with the same preset, thread count and
steps, one after the other (the order alternates from pair to pair); the ratio is taken within
each pair and the mean of the ratios is printed with its 95% interval. Before timing anything
the script checks that the two models hold the same parameter tensors (element counts, from the
configuration ftrec reports and from PyTorch's module), so the comparison cannot drift. Run it on
an otherwise idle machine. Needs only the standard library; PyTorch runs in its own venv.
"""

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
PEER = ROOT / "scripts" / "peer" / "dlrm.py"
# Two-sided 95% Student t quantiles by degrees of freedom.
T95 = {1: 12.706, 2: 4.303, 3: 3.182, 4: 2.776, 5: 2.571, 6: 2.447, 7: 2.365, 8: 2.306,
       9: 2.262, 10: 2.228, 12: 2.179, 15: 2.131, 20: 2.086, 30: 2.042}


def t95(df):
    return T95.get(df) or T95[max(k for k in T95 if k <= df)]


def venv_dir():
    return Path(os.environ.get("FTREC_PEER_VENV", ROOT / "target" / "peer-venv"))


def install():
    v = venv_dir()
    if not (v / "bin" / "python").exists():
        subprocess.run([sys.executable, "-m", "venv", str(v)], check=True)
    subprocess.run([str(v / "bin" / "pip"), "install", "--progress-bar", "off", "torch", "numpy"],
                   check=True)


def ftrec_binary(args):
    if args.ftrec:
        return Path(args.ftrec)
    subprocess.run(["cargo", "build", "--release", "--quiet", "-p", "ftrec-cli"], cwd=ROOT,
                   check=True)
    return ROOT / "target" / "release" / "ftrec"


def run_ftrec(exe, a):
    with tempfile.TemporaryDirectory() as d:
        out = Path(d) / "train.json"
        subprocess.run([str(exe), "train", "--preset", a.preset, "--threads", str(a.threads),
                        "--steps", str(a.steps), "--eval-samples", "8192", "--json", str(out)],
                       check=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        return json.loads(out.read_text())


def run_peer(py, a):
    out = subprocess.run([str(py), str(PEER), "--preset", a.preset, "--threads", str(a.threads),
                          "--steps", str(a.steps)], check=True, capture_output=True, text=True)
    return json.loads(out.stdout.strip().splitlines()[-1])


def ftrec_tensors(report):
    """ftrec's parameter tensors under the peer's names (PyTorch's nn.Sequential numbering)."""
    p = report["config"]["preset"]
    dim = p["dim"]
    t = {f"emb.{i}.weight": rows * dim for i, rows in enumerate(p["table_rows"])}
    n = len(p["table_rows"]) + 1
    for name, inp, widths in (("bottom", 13, p["mlp"]["bottom"]),
                              ("top", dim + n * (n - 1) // 2, p["mlp"]["top"])):
        for i, out in enumerate(widths):
            # Every layer but the top's last is followed by a ReLU module.
            t[f"{name}.{2 * i}.weight"] = out * inp
            t[f"{name}.{2 * i}.bias"] = out
            inp = out
    return t


def mean_ci(xs):
    """Mean and the half-width of its 95% interval (None from a single pair)."""
    m = statistics.fmean(xs)
    if len(xs) < 2:
        return m, None
    return m, t95(len(xs) - 1) * statistics.stdev(xs) / len(xs) ** 0.5


def pm(ci, fmt):
    return "" if ci is None else " +- " + format(ci, fmt)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--install", action="store_true",
                    help="install PyTorch and numpy into the peer venv first (about 5 GB)")
    ap.add_argument("--preset", choices=["small", "kaggle"], default="small")
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--steps", type=int, default=300)
    ap.add_argument("--pairs", type=int, default=3)
    ap.add_argument("--ftrec", help="the ftrec binary (default: build target/release/ftrec)")
    ap.add_argument("--json", help="write the pairs and the summary here")
    a = ap.parse_args()
    if a.threads < 1 or a.steps < 1 or a.pairs < 1:
        sys.exit("compare.py: --threads, --steps and --pairs must be at least 1")
    if a.install:
        install()
    py = venv_dir() / "bin" / "python"
    if not py.exists() or subprocess.run([str(py), "-c", "import torch, numpy"],
                                         capture_output=True).returncode != 0:
        sys.exit(f"compare.py: no PyTorch in {venv_dir()}; run with --install first "
                 "(or set FTREC_PEER_VENV to a venv that has torch and numpy)")
    exe = ftrec_binary(a)

    # The shapes first, on one short run each.
    check = argparse.Namespace(**{**vars(a), "steps": 2})
    ours, theirs = ftrec_tensors(run_ftrec(exe, check)), run_peer(py, check)["tensors"]
    if ours != theirs:
        diff = sorted(k for k in ours.keys() | theirs.keys() if ours.get(k) != theirs.get(k))
        sys.exit("compare.py: the two models differ in "
                 + ", ".join(f"{k} (ftrec {ours.get(k)}, pytorch {theirs.get(k)})" for k in diff))
    print(f"shapes match: {len(ours)} tensors, {sum(ours.values()):,} parameters", flush=True)

    pairs = []
    for i in range(a.pairs):
        order = ("ftrec", "pytorch") if i % 2 == 0 else ("pytorch", "ftrec")
        got = {}
        for who in order:
            got[who] = (run_ftrec(exe, a) if who == "ftrec" else run_peer(py, a))["samples_per_s"]
        ratio = got["ftrec"] / got["pytorch"]
        pairs.append({"ftrec": got["ftrec"], "pytorch": got["pytorch"], "ratio": ratio})
        print(f"pair {i + 1}/{a.pairs}: ftrec {got['ftrec']:,.0f} samples/s, "
              f"pytorch {got['pytorch']:,.0f} samples/s, ratio {ratio:.3f}", flush=True)
    summary = {}
    for k in ("ftrec", "pytorch", "ratio"):
        m, ci = mean_ci([p[k] for p in pairs])
        summary[k] = {"mean": m, "ci95": ci}
    print(f"{a.preset}, {a.threads} thread(s), {a.steps} steps x {a.pairs} pairs: "
          f"ftrec {summary['ftrec']['mean']:,.0f}{pm(summary['ftrec']['ci95'], ',.0f')}, "
          f"pytorch {summary['pytorch']['mean']:,.0f}{pm(summary['pytorch']['ci95'], ',.0f')} "
          f"samples/s; ftrec / pytorch {summary['ratio']['mean']:.3f}"
          f"{pm(summary['ratio']['ci95'], '.3f')}")
    if a.json:
        Path(a.json).write_text(json.dumps({"preset": a.preset, "threads": a.threads,
                                            "steps": a.steps, "pairs": pairs,
                                            "summary": summary}, indent=2))


if __name__ == "__main__":
    main()
