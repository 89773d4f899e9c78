"""PyTorch on ftrec's embedding servers: a module whose forward pass looks a batch's rows up
from the job's servers and whose backward pass sends their gradients back, the servers applying
the row optimizer under the job's strategy; the dense part stays in PyTorch with the user's
optimizer.

    >>> client = ftrec.EmbeddingClient(job.control, 0)
    >>> emb = ftrec.torch.RemoteEmbeddings()
    >>> model = MyModel(client.tables, client.dim)       # any nn.Module on [B, tables, dim]
    >>> dense = ftrec.torch.DenseCheckpoints(model, opt)
    >>> client.on_rollback(dense.load)                   # full, deck, incrcp, ... roll back
    >>> for batch in client:
    ...     try:
    ...         x = emb(batch)                            # [B, tables, dim], from the servers
    ...         loss = loss_fn(model(x, batch), target(batch))
    ...         opt.zero_grad()
    ...         emb.loss = loss.item()                    # reported with the update (optional)
    ...         loss.backward()                           # the rows' gradients go to the servers
    ...     except ftrec.BatchLost:                       # a failure took it: it comes again
    ...         continue
    ...     opt.step()
    ...     dense.save(batch.index // client.workers)

Needs PyTorch (``import torch``); the rest of the package does not.
"""

from __future__ import annotations

from typing import Any, Dict, List, Optional, Sequence

import torch
from torch import nn

__all__ = ["RemoteEmbeddings", "Dlrm", "DenseCheckpoints"]


class _Lookup(torch.autograd.Function):
    """Forward: the batch's pooled rows from the servers. Backward: their gradient to the
    servers (the batch's update; returns when it has landed)."""

    @staticmethod
    def forward(ctx: Any, anchor: torch.Tensor, batch: Any, owner: "RemoteEmbeddings") -> torch.Tensor:
        ctx.batch = batch
        ctx.owner = owner
        return torch.from_numpy(batch.lookup())

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor):  # type: ignore[override]
        g = grad.detach().to(torch.float32).contiguous().numpy()
        loss = ctx.owner.loss
        ctx.batch.send(g, 0.0 if loss is None else float(loss))
        ctx.owner.loss = None
        return None, None, None


class RemoteEmbeddings(nn.Module):
    """The job's embedding tables as a module: ``emb(batch)`` is the batch's bags summed, a
    float32 tensor ``[batch, tables, dim]`` that requires grad; ``backward()`` through it sends
    the gradient to the servers. Set ``emb.loss`` to the batch's loss before ``backward()`` to
    have the job's report carry it."""

    def __init__(self) -> None:
        super().__init__()
        # Gives the lookup an input that requires grad, so autograd calls its backward.
        self._anchor = nn.Parameter(torch.zeros(0), requires_grad=True)
        self.loss: Optional[float] = None

    def forward(self, batch: Any) -> torch.Tensor:
        return _Lookup.apply(self._anchor, batch, self)


def _mlp(widths: Sequence[int], last_relu: bool) -> nn.Sequential:
    layers: List[nn.Module] = []
    for i in range(len(widths) - 1):
        layers.append(nn.Linear(widths[i], widths[i + 1]))
        if i + 2 < len(widths) or last_relu:
            layers.append(nn.ReLU())
    return nn.Sequential(*layers)


class Dlrm(nn.Module):
    """ftrec's DLRM dense part in PyTorch: the bottom MLP on the dense features (a ReLU after
    every layer), the dot interaction of its output with every table's pooled row (the strictly
    upper pairs) beside that output, and the top MLP (no ReLU after its last layer) to one
    logit. ``forward(dense [B, 13], pooled [B, tables, dim])`` gives the logits ``[B]``.
    Build it for a job with ``Dlrm.for_client(client)``."""

    def __init__(self, dense_features: int, tables: int, dim: int,
                 bottom: Sequence[int], top: Sequence[int]) -> None:
        super().__init__()
        if not bottom or bottom[-1] != dim:
            raise ValueError(f"the bottom MLP must end at the embedding width {dim} (got {list(bottom)})")
        if not top or top[-1] != 1:
            raise ValueError(f"the top MLP must end at one logit (got {list(top)})")
        self.bottom = _mlp([dense_features, *bottom], last_relu=True)
        n = tables + 1
        self.register_buffer("pairs", torch.triu_indices(n, n, offset=1), persistent=False)
        self.top = _mlp([dim + n * (n - 1) // 2, *top], last_relu=False)

    @classmethod
    def for_client(cls, client: Any) -> "Dlrm":
        return cls(client.dense_features, client.tables, client.dim, client.bottom_mlp,
                   client.top_mlp)

    def forward(self, dense: torch.Tensor, pooled: torch.Tensor) -> torch.Tensor:
        z0 = self.bottom(dense)
        t = torch.cat([z0.unsqueeze(1), pooled], dim=1)
        dots = torch.bmm(t, t.transpose(1, 2))
        upper = dots[:, self.pairs[0], self.pairs[1]]
        return self.top(torch.cat([z0, upper], dim=1)).squeeze(1)


class DenseCheckpoints:
    """The dense part's state (a module's and, if given, its optimizer's ``state_dict``) kept
    by step, so that a rollback of the tables to a step can reload the dense part of the same
    step: ``client.on_rollback(dense.load)``. ``every`` keeps one state in that many steps
    (give the job's checkpoint interval, or 1); ``keep`` bounds how many are held (the oldest go
    first). ``path``, when given, is a directory where each state is also written
    (``dense-{step}.pt``), so a trainer that restarts can reload it."""

    def __init__(self, module: nn.Module, optimizer: Optional[torch.optim.Optimizer] = None, *,
                 every: int = 1, keep: int = 64, path: Optional[str] = None) -> None:
        if every < 1 or keep < 1:
            raise ValueError("every and keep must be at least 1")
        self.module, self.optimizer = module, optimizer
        self.every, self.keep, self.path = every, keep, path
        self.states: Dict[int, Dict[str, Any]] = {}
        self.save(0)

    def _state(self) -> Dict[str, Any]:
        import copy
        state = {"module": copy.deepcopy(self.module.state_dict())}
        if self.optimizer is not None:
            state["optimizer"] = copy.deepcopy(self.optimizer.state_dict())
        return state

    def save(self, step: int) -> None:
        """Keep the state after ``step`` (when ``step`` is a multiple of ``every``)."""
        if step % self.every:
            return
        state = self._state()
        self.states[step] = state
        while len(self.states) > self.keep:
            del self.states[min(self.states)]
        if self.path is not None:
            import os
            os.makedirs(self.path, exist_ok=True)
            torch.save(state, os.path.join(self.path, f"dense-{step}.pt"))

    def load(self, step: int) -> None:
        """Reload the state after ``step`` (the rollback hook). Raises ``KeyError`` naming the
        steps held when there is none for ``step``."""
        state = self.states.get(step)
        if state is None and self.path is not None:
            import os
            f = os.path.join(self.path, f"dense-{step}.pt")
            if os.path.exists(f):
                state = torch.load(f, weights_only=False)
        if state is None:
            raise KeyError(
                f"no dense state for step {step} (held: {sorted(self.states)}); save every "
                "step the job can roll back to (every= its checkpoint interval)")
        self.module.load_state_dict(state["module"])
        if self.optimizer is not None and "optimizer" in state:
            self.optimizer.load_state_dict(state["optimizer"])
        for s in [s for s in self.states if s > step]:
            del self.states[s]
