#!/usr/bin/env python3
"""A PyTorch model that is not ftrec's DLRM (a DeepFM) trained on ftrec's embedding servers,
with a server SIGKILLed mid-run, under ECRec and under DECK.

    python examples/torch_custom_model.py                      # tiny preset, 3 servers
    python examples/torch_custom_model.py --preset small --steps 300

For each strategy it runs the job twice in synchronous mode, without and with the kill, and
prints the recovery and the progressive-validation AUC of the last batches (each batch scored
before the model trains on it) of both runs. The tables live on ftrec's servers, protected by
the strategy; the dense part (the DeepFM's linear, FM and deep parts) is this script's, in
PyTorch with Adagrad:

* under `ecrec` the lost server's rows are rebuilt from the others' parity while training goes
  on: the trainer never rolls back;
* under `deck` the job rolls the tables back to the newest checkpoint and the client calls
  the rollback hook, which reloads the dense part of that step (`ftrec.torch.DenseCheckpoints`).

Either way the run with the kill ends at the same model as the run without it: the same AUC and
the servers' `model_digest`. Needs PyTorch and the `ftrec` package (README, "From Python"), and
the `ftrec` executable (`--ftrec`, else $FTREC_BIN, else on PATH).
"""

import argparse
import sys

import numpy as np
import torch
from torch import nn

import ftrec
from ftrec.torch import DenseCheckpoints, RemoteEmbeddings


class DeepFM(nn.Module):
    """Linear part on the dense features, factorization machine over the tables' pooled rows
    and a projection of the dense features, and a deep MLP over the same vectors."""

    def __init__(self, tables, dim, dense_features):
        super().__init__()
        self.linear = nn.Linear(dense_features, 1)
        self.project = nn.Linear(dense_features, dim)
        self.deep = nn.Sequential(
            nn.Linear((tables + 1) * dim, 128), nn.ReLU(),
            nn.Linear(128, 64), nn.ReLU(),
            nn.Linear(64, 1))

    def forward(self, dense, pooled):
        v = torch.cat([self.project(dense).unsqueeze(1), pooled], dim=1)  # [B, tables + 1, dim]
        fm = 0.5 * (v.sum(dim=1).pow(2) - v.pow(2).sum(dim=1)).sum(dim=1)
        return self.linear(dense).squeeze(1) + fm + self.deep(v.flatten(1)).squeeze(1)


STRATEGY = {
    "ecrec": {},
    "deck": {"delta_every_steps": 5, "merge_stride": 0},
}


def train(a, strategy, kill):
    """One job: its report, its recovery events, the AUC of the last batches, the dense part."""
    job = ftrec.Job(preset=a.preset, servers=a.servers, workers=1, sync=True, steps=a.steps,
                    seed=a.seed, strategy=strategy, eval_samples=0, workers_elsewhere=True,
                    kill=[f"server=1@step={a.kill_step}"] if kill else None,
                    binary=a.ftrec, **STRATEGY[strategy])
    try:
        client = ftrec.EmbeddingClient(job.control, 0)
        torch.manual_seed(a.seed)
        emb = RemoteEmbeddings()
        model = DeepFM(client.tables, client.dim, client.dense_features)
        opt = torch.optim.Adagrad(model.parameters(), lr=a.lr)
        dense = DenseCheckpoints(model, opt)
        client.on_rollback(dense.load)
        loss_fn = nn.BCEWithLogitsLoss()
        scored = {}
        for batch in client:
            try:
                logits = model(torch.from_numpy(batch.dense), emb(batch))
                if batch.index > a.steps - a.eval_batches:
                    scored[batch.index] = (torch.sigmoid(logits).detach().numpy().copy(),
                                           batch.labels.copy())
                loss = loss_fn(logits, torch.from_numpy(batch.labels))
                opt.zero_grad(set_to_none=True)
                emb.loss = loss.item()
                loss.backward()
            except ftrec.BatchLost:
                continue
            opt.step()
            dense.save(batch.index)
        report = job.wait()
        events = [e for e in job.events(timeout=0) if e["kind"] in (
            "FailureInjected", "FailureDetected", "ServerReplaced", "TrainingResumed",
            "RecoveryComplete")]
    finally:
        job.stop()
    scores = np.concatenate([scored[i][0] for i in sorted(scored)])
    labels = np.concatenate([scored[i][1] for i in sorted(scored)])
    weights = torch.cat([p.detach().flatten() for p in model.parameters()]).numpy()
    return report, events, ftrec.evaluate(scores, labels)["auc"], weights


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--preset", default="tiny")
    ap.add_argument("--servers", type=int, default=3)
    ap.add_argument("--steps", type=int, default=120)
    ap.add_argument("--kill-step", type=int, default=63)
    ap.add_argument("--eval-batches", type=int, default=20)
    ap.add_argument("--seed", type=int, default=7)
    ap.add_argument("--lr", type=float, default=0.02)
    ap.add_argument("--strategies", default="ecrec,deck")
    ap.add_argument("--ftrec", help="the ftrec executable [default: $FTREC_BIN, ftrec on PATH]")
    a = ap.parse_args()
    if not 0 < a.kill_step < a.steps or not 0 < a.eval_batches <= a.steps:
        sys.exit("--kill-step must lie inside the run and --eval-batches in 1..--steps")
    strategies = a.strategies.split(",")
    for s in strategies:
        if s not in STRATEGY:
            sys.exit(f"--strategies: {s!r} is not one of {', '.join(STRATEGY)}")
    # One thread: PyTorch's float sums then come out the same in both runs.
    torch.set_num_threads(1)
    failed = False
    for s in strategies:
        clean, _, clean_auc, clean_w = train(a, s, kill=False)
        killed, events, killed_auc, killed_w = train(a, s, kill=True)
        print(f"{s}: server 1 SIGKILLed after step {a.kill_step} of {a.steps}")
        for e in events:
            print(f"  {e['kind']:<17} step {e.get('step')}: {e.get('message')}")
        same = (clean["model_digest"] == killed["model_digest"]
                and np.array_equal(clean_w, killed_w))
        failed |= not same
        print(f"  AUC of the last {a.eval_batches} batches: {clean_auc:.4f} without the kill, "
              f"{killed_auc:.4f} with it; the same model: {'yes' if same else 'NO'}")
    sys.exit(1 if failed else 0)


if __name__ == "__main__":
    main()
