#!/usr/bin/env python3
"""What more threads add to `ftrec train`, measured in interleaved rounds on one machine.

    scripts/peer/scaling.py --ftrec target/release/ftrec --preset small --rounds 4
    scripts/peer/scaling.py --ftrec new/ftrec --before old/ftrec --preset small --rounds 4

Each round runs `ftrec train` with one thread and with `--threads` threads (two by default),
and, with `--before`, the same two runs of a second binary (the code before a change); the
order of the binaries alternates from round to round. Every ratio is taken within a round:
samples/s at N threads over one thread for each binary, and, with `--before`, the binary over
the one before at each thread count. The means are printed with their 95% intervals. Needs only
the standard library and the binaries; run it on an otherwise idle machine.
"""

import argparse
import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from compare import mean_ci, pm  # noqa: E402


def run(exe, preset, threads, steps):
    import subprocess
    import tempfile

    with tempfile.TemporaryDirectory() as d:
        out = Path(d) / "train.json"
        done = subprocess.run([str(exe), "train", "--preset", preset, "--threads", str(threads),
                               "--steps", str(steps), "--json", str(out)],
                              stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
        if done.returncode != 0:
            last = (done.stderr.strip().splitlines() or ["(no output)"])[-1]
            sys.exit(f"scaling.py: {exe} train failed: {last}")
        return json.loads(out.read_text())["samples_per_s"]


def summary(xs):
    m, ci = mean_ci(xs)
    return {"mean": m, "ci95": ci, "rounds": xs}


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--ftrec", required=True, help="the ftrec binary to measure")
    ap.add_argument("--before", help="a second ftrec binary, measured in the same rounds")
    ap.add_argument("--preset", default="small")
    ap.add_argument("--threads", type=int, default=2, help="compared with one thread")
    ap.add_argument("--steps", type=int, default=300)
    ap.add_argument("--rounds", type=int, default=4)
    ap.add_argument("--json", help="write every run and the summary here")
    a = ap.parse_args()
    if a.threads < 2:
        ap.error("--threads must be at least 2 (it is compared with one thread)")
    if a.rounds < 2:
        ap.error("--rounds must be at least 2 for an interval")
    if a.steps < 1:
        ap.error("--steps must be at least 1")
    binaries = {"ftrec": Path(a.ftrec)}
    if a.before:
        binaries["before"] = Path(a.before)
    for name, exe in binaries.items():
        if not exe.is_file():
            ap.error(f"--{'ftrec' if name == 'ftrec' else 'before'} {exe}: no such file")

    runs = []
    names = list(binaries)
    for r in range(a.rounds):
        order = names if r % 2 == 0 else names[::-1]
        row = {}
        for threads in (1, a.threads):
            for name in order:
                row[(name, threads)] = run(binaries[name], a.preset, threads, a.steps)
        runs.append(row)
        print(f"round {r + 1}/{a.rounds}: " + ", ".join(
            f"{name} {threads} thread(s) {row[(name, threads)]:,.0f}"
            for name in names for threads in (1, a.threads)), flush=True)

    out = {"preset": a.preset, "threads": a.threads, "steps": a.steps,
           "runs": [{f"{n}_{t}": v for (n, t), v in row.items()} for row in runs]}
    for name in names:
        gain = summary([row[(name, a.threads)] / row[(name, 1)] for row in runs])
        out[f"{name}_scaling"] = gain
        print(f"{name}: {a.threads} threads / 1 = {gain['mean']:.3f}{pm(gain['ci95'], '.3f')}")
    if a.before:
        for threads in (1, a.threads):
            ratio = summary([row[("ftrec", threads)] / row[("before", threads)] for row in runs])
            out[f"over_before_{threads}"] = ratio
            print(f"ftrec / before at {threads} thread(s) = {ratio['mean']:.3f}"
                  f"{pm(ratio['ci95'], '.3f')}")
    if a.json:
        Path(a.json).write_text(json.dumps(out, indent=2) + "\n")


if __name__ == "__main__":
    main()
