"""The DLRM of an ftrec preset in plain PyTorch, timed as `ftrec train` times itself.

Same shapes (26 tables of the preset's capped rows, embedding dim, bottom MLP with a ReLU after
every layer, the dot interaction's strictly upper pairs beside the bottom output, top MLP with
no ReLU after the last layer), same batch, row-wise Adagrad on the embedding rows and Adagrad on
the MLP, binary cross-entropy on the logit. Ids are drawn from a Zipf distribution of the
preset's exponent, as ftrec's synthetic data draws them.

The batches are made before the clock starts and cycled, so the peer pays nothing for its data
while ftrec's prefetch thread makes every batch during training: the comparison leans towards
PyTorch, never away from it.

Prints one JSON object: samples/s over the timed steps, the threads, and every parameter
tensor's element count (the runner checks them against ftrec's model).
"""

import argparse
import json
import math
import sys
import time

import numpy as np
import torch
from torch import nn

# The ftrec presets' shapes (crates/core/src/preset.rs). The runner checks the parameter counts
# against the configuration `ftrec train --json` reports, so a drift here fails loudly.
KAGGLE_TABLE_ROWS = [
    1460, 583, 10131227, 2202608, 305, 24, 12517, 633, 3, 93145, 5683, 8351593, 3194, 27, 14992,
    5461306, 10, 5652, 2173, 4, 7046547, 18, 15, 286181, 105, 142572,
]
PRESETS = {
    "small": dict(cap=120_000, dim=16, bottom=[512, 256, 64, 16], top=[512, 256, 1], batch=2048,
                  sparse_lr=0.05, dense_lr=0.02, zipf=1.05),
    "kaggle": dict(cap=None, dim=16, bottom=[512, 256, 64, 16], top=[512, 256, 1], batch=2048,
                   sparse_lr=0.05, dense_lr=0.02, zipf=1.05),
}
NUM_DENSE = 13
EPS = 1e-8


def mlp(widths, last_relu):
    layers = []
    for i in range(len(widths) - 1):
        layers.append(nn.Linear(widths[i], widths[i + 1]))
        if i + 2 < len(widths) or last_relu:
            layers.append(nn.ReLU())
    return nn.Sequential(*layers)


class Dlrm(nn.Module):
    def __init__(self, rows, dim, bottom, top):
        super().__init__()
        self.emb = nn.ModuleList(
            nn.EmbeddingBag(r, dim, mode="sum", sparse=True) for r in rows)
        for e in self.emb:
            nn.init.uniform_(e.weight, -0.05, 0.05)
        self.bottom = mlp([NUM_DENSE] + bottom, last_relu=True)
        n = len(rows) + 1
        self.pairs = torch.triu_indices(n, n, offset=1)
        self.top = mlp([dim + n * (n - 1) // 2] + top, last_relu=False)

    def forward(self, dense, ids, offsets):
        z0 = self.bottom(dense)
        pooled = [e(ids[:, t], offsets) for t, e in enumerate(self.emb)]
        t = torch.stack([z0] + pooled, dim=1)  # [B, n, dim]
        dots = torch.bmm(t, t.transpose(1, 2))  # [B, n, n]
        upper = dots[:, self.pairs[0], self.pairs[1]]
        return self.top(torch.cat([z0, upper], dim=1)).squeeze(1)


def rowwise_adagrad_(emb, state, lr):
    """a += mean(g^2) per touched row; w -= lr g / (sqrt(a) + eps) (ftrec's rule)."""
    g = emb.weight.grad.coalesce()
    rows = g.indices()[0]
    vals = g.values()
    state.index_add_(0, rows, vals.pow(2).mean(dim=1))
    scale = lr / (state[rows].sqrt() + EPS)
    emb.weight.data.index_add_(0, rows, -vals * scale.unsqueeze(1))
    emb.weight.grad = None


def zipf_ids(rng, rows, exponent, n):
    """Bounded Zipf ranks by inverse CDF, spread over the table by a fixed permutation."""
    ranks = np.arange(1, rows + 1, dtype=np.float64)
    cdf = np.cumsum(ranks ** -exponent)
    cdf /= cdf[-1]
    r = np.searchsorted(cdf, rng.random(n))
    return (r * 2654435761) % rows


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--preset", choices=sorted(PRESETS), default="small")
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--steps", type=int, default=300)
    ap.add_argument("--batches", type=int, default=16, help="distinct batches made and cycled")
    ap.add_argument("--seed", type=int, default=1)
    a = ap.parse_args()
    if a.threads < 1 or a.steps < 1 or a.batches < 1:
        sys.exit("dlrm.py: --threads, --steps and --batches must be at least 1")
    p = PRESETS[a.preset]
    torch.manual_seed(a.seed)
    torch.set_num_threads(a.threads)
    torch.set_num_interop_threads(1)
    rows = [r if p["cap"] is None else min(r, p["cap"]) for r in KAGGLE_TABLE_ROWS]
    model = Dlrm(rows, p["dim"], p["bottom"], p["top"])
    dense_params = list(model.bottom.parameters()) + list(model.top.parameters())
    dense_opt = torch.optim.Adagrad(dense_params, lr=p["dense_lr"], eps=EPS)
    states = [torch.zeros(r) for r in rows]
    rng = np.random.default_rng(a.seed)
    b = p["batch"]
    batches = []
    for _ in range(a.batches):
        dense = torch.from_numpy(np.log1p(rng.exponential(3.0, (b, NUM_DENSE))).astype(np.float32))
        ids = torch.from_numpy(
            np.stack([zipf_ids(rng, r, p["zipf"], b) for r in rows], axis=1).astype(np.int64))
        labels = torch.from_numpy((rng.random(b) < 0.25).astype(np.float32))
        batches.append((dense, ids, labels))
    offsets = torch.arange(b, dtype=torch.int64)
    loss_fn = nn.BCEWithLogitsLoss()

    def step(i):
        dense, ids, labels = batches[i % len(batches)]
        loss = loss_fn(model(dense, ids, offsets), labels)
        dense_opt.zero_grad(set_to_none=True)
        loss.backward()
        dense_opt.step()
        with torch.no_grad():
            for e, s in zip(model.emb, states):
                rowwise_adagrad_(e, s, p["sparse_lr"])
        return loss.item()

    start = time.perf_counter()
    loss = float("nan")
    for i in range(a.steps):
        loss = step(i)
    train_s = time.perf_counter() - start
    tensors = {name: t.numel() for name, t in model.named_parameters()}
    print(json.dumps({
        "system": "pytorch",
        "torch": torch.__version__,
        "preset": a.preset,
        "threads": a.threads,
        "steps": a.steps,
        "batch": b,
        "train_s": train_s,
        "samples_per_s": a.steps * b / train_s,
        "last_loss": loss if math.isfinite(loss) else None,
        "tensors": tensors,
    }))


if __name__ == "__main__":
    main()
