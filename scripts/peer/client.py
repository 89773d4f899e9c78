#!/usr/bin/env python3
"""The embedding client's throughput from Python against ftrec's own worker, on the same model,
servers and data, in interleaved pairs.

    scripts/peer/client.py --preset small --servers 2 --steps 100 --pairs 3 --threads 1

Each pair runs one `ftrec run` job with ftrec's worker (`--workers 1`) and one with the worker
in this Python process (`--workers-elsewhere`: `ftrec.EmbeddingClient` with ftrec's DLRM in
PyTorch, `ftrec.torch.Dlrm`, Adagrad on the MLPs, the rows' row-wise Adagrad on the servers),
the order alternating from pair to pair. Both jobs run strategy `none`, the preset's batch and
the same thread count, and each reports its training samples/s as every `ftrec run` report
defines it; the ratio (Python / ftrec) is taken within each pair and its mean is printed with
its 95% interval (and written as JSON with --json). Needs PyTorch and the `ftrec` package in
the running interpreter (scripts/peer/compare.py --install, then `pip install ./python` into
that venv).
"""

import argparse
import json
import os
import statistics
import sys
import time

T95 = {1: 12.706, 2: 4.303, 3: 3.182, 4: 2.776, 5: 2.571, 6: 2.447, 7: 2.365, 8: 2.306,
       9: 2.262, 10: 2.228}


def interval(xs):
    if len(xs) < 2:
        return float("nan")
    return T95.get(len(xs) - 1, 2.0) * statistics.stdev(xs) / len(xs) ** 0.5


def settings(a, **extra):
    s = dict(preset=a.preset, servers=a.servers, workers=1, steps=a.steps, seed=a.seed,
             strategy="none", eval_samples=0, threads=a.threads)
    s.update(extra)
    return s


def run_ftrec_worker(ftrec, a):
    return ftrec.Job(settings(a), binary=a.ftrec).wait()


def run_python_worker(ftrec, a):
    import torch
    from ftrec.torch import Dlrm, RemoteEmbeddings

    torch.manual_seed(a.seed)
    torch.set_num_threads(a.threads)
    job = ftrec.Job(settings(a, workers_elsewhere=True), binary=a.ftrec)
    try:
        client = ftrec.EmbeddingClient(job.control, 0)
        emb, model = RemoteEmbeddings(), Dlrm.for_client(client)
        opt = torch.optim.Adagrad(model.parameters(), lr=a.dense_lr, eps=1e-8)
        loss_fn = torch.nn.BCEWithLogitsLoss()
        lost = 0
        for batch in client:
            try:
                pooled = emb(batch)
                logits = model(torch.from_numpy(batch.dense), pooled)
                loss = loss_fn(logits, torch.from_numpy(batch.labels))
                opt.zero_grad(set_to_none=True)
                emb.loss = loss.item()
                loss.backward()
            except ftrec.BatchLost:
                lost += 1
                continue
            opt.step()
        report = job.wait()
    finally:
        job.stop()
    report["batches_lost"] = lost
    return report


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--preset", default="small")
    ap.add_argument("--servers", type=int, default=2)
    ap.add_argument("--steps", type=int, default=100)
    ap.add_argument("--pairs", type=int, default=3)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--dense-lr", type=float, default=0.02)
    ap.add_argument("--ftrec", help="the ftrec executable [default: $FTREC_BIN, ftrec on PATH]")
    ap.add_argument("--json", help="write the figures here")
    a = ap.parse_args()
    if min(a.servers, a.steps, a.pairs, a.threads) < 1:
        sys.exit("client.py: --servers, --steps, --pairs and --threads must be at least 1")
    try:
        import ftrec
        import torch  # noqa: F401
    except ImportError as e:
        sys.exit(f"client.py: {e}: run it with a Python that has PyTorch and the ftrec package")
    a.ftrec = ftrec.job.find_binary(a.ftrec)
    pairs = []
    for i in range(a.pairs):
        order = ["ftrec", "python"] if i % 2 == 0 else ["python", "ftrec"]
        got = {}
        for who in order:
            t = time.perf_counter()
            r = run_ftrec_worker(ftrec, a) if who == "ftrec" else run_python_worker(ftrec, a)
            got[who] = r
            print(f"pair {i + 1}/{a.pairs}: {who} worker {r['samples_per_s']:.0f} samples/s "
                  f"({time.perf_counter() - t:.1f} s)", file=sys.stderr)
        pairs.append({
            "ftrec_samples_per_s": got["ftrec"]["samples_per_s"],
            "python_samples_per_s": got["python"]["samples_per_s"],
            "ratio": got["python"]["samples_per_s"] / got["ftrec"]["samples_per_s"],
            "python_worker_time": got["python"]["worker_time"],
            "ftrec_worker_time": got["ftrec"]["worker_time"],
        })
    ratios = [p["ratio"] for p in pairs]
    out = {
        "preset": a.preset, "servers": a.servers, "steps": a.steps, "threads": a.threads,
        "pairs": pairs, "ratio_mean": statistics.mean(ratios), "ratio_ci95": interval(ratios),
        "load_avg": os.getloadavg(),
    }
    print(json.dumps(out, indent=1) if a.json is None else
          f"python / ftrec worker: {out['ratio_mean']:.3f} +- {out['ratio_ci95']:.3f} "
          f"({a.pairs} pairs)")
    if a.json:
        with open(a.json, "w") as f:
            json.dump(out, f, indent=1)


if __name__ == "__main__":
    main()
