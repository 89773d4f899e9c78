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

__all__ = ["RemoteEmbeddings", "Dlrm", "DlrmModel", "dlrm_from_store", "DenseCheckpoints"]


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


class Dlrm(nn.Module):
    """ftrec's DLRM dense part in PyTorch: the bottom MLP on the dense features (a ReLU after
    every layer), the dot interaction of its output with every table's pooled row (the strictly
    upper pairs) beside that output, and the top MLP (no ReLU after its last layer) to one
    logit. ``forward(dense [B, 13], pooled [B, tables, dim])`` gives the logits ``[B]``. Its
    parameters are named as ``ftrec ckpt export`` names them (``bottom_mlp.{i}.weight``
    ``[out, in]``, ...). Build it for a job with ``Dlrm.for_client(client)``."""

    def __init__(self, dense_features: int, tables: int, dim: int,
                 bottom: Sequence[int], top: Sequence[int]) -> None:
        super().__init__()
        if not bottom or bottom[-1] != dim:
            raise ValueError(f"the bottom MLP must end at the embedding width {dim} (got {list(bottom)})")
        if not top or top[-1] != 1:
            raise ValueError(f"the top MLP must end at one logit (got {list(top)})")
        widths = [dense_features, *bottom]
        self.bottom_mlp = nn.ModuleList(
            nn.Linear(widths[i], widths[i + 1]) for i in range(len(widths) - 1))
        n = tables + 1
        self.register_buffer("pairs", torch.triu_indices(n, n, offset=1), persistent=False)
        widths = [dim + n * (n - 1) // 2, *top]
        self.top_mlp = nn.ModuleList(
            nn.Linear(widths[i], widths[i + 1]) for i in range(len(widths) - 1))

    @classmethod
    def for_client(cls, client: Any) -> "Dlrm":
        return cls(client.dense_features, client.tables, client.dim, client.bottom_mlp,
                   client.top_mlp)

    def forward(self, dense: torch.Tensor, pooled: torch.Tensor) -> torch.Tensor:
        z0 = dense
        for layer in self.bottom_mlp:
            z0 = torch.relu(layer(z0))
        t = torch.cat([z0.unsqueeze(1), pooled], dim=1)
        dots = torch.bmm(t, t.transpose(1, 2))
        x = torch.cat([z0, dots[:, self.pairs[0], self.pairs[1]]], dim=1)
        last = len(self.top_mlp) - 1
        for i, layer in enumerate(self.top_mlp):
            x = layer(x)
            if i < last:
                x = torch.relu(x)
        return x.squeeze(1)


class DlrmModel(nn.Module):
    """ftrec's whole DLRM in PyTorch: ``embedding.{t}`` ``nn.EmbeddingBag``s (sum) and the
    dense part of :class:`Dlrm` (``bottom_mlp``, ``top_mlp``), named as ``ftrec ckpt export``
    names its tensors. ``forward(dense [B, 13], sparse)`` gives the logits ``[B]``; ``sparse`` is
    per table a pair ``(offsets [B + 1], ids)`` as ``Store.held_out()`` and ``ftrec.Batch`` give
    it (NumPy or tensors). ``predict`` gives click probabilities."""

    def __init__(self, table_rows: Sequence[int], dim: int, dense_features: int,
                 bottom: Sequence[int], top: Sequence[int]) -> None:
        super().__init__()
        self.embedding = nn.ModuleList(nn.EmbeddingBag(r, dim, mode="sum") for r in table_rows)
        self.dense = Dlrm(dense_features, len(table_rows), dim, bottom, top)
        # The export's names: bottom_mlp and top_mlp at the top level.
        self.bottom_mlp = self.dense.bottom_mlp
        self.top_mlp = self.dense.top_mlp

    def forward(self, dense: Any, sparse: Sequence[Any]) -> torch.Tensor:
        dense = torch.as_tensor(dense)
        pooled = []
        for bag, (offsets, ids) in zip(self.embedding, sparse):
            offsets = torch.as_tensor(offsets.astype("int64") if hasattr(offsets, "astype") else offsets)
            ids = torch.as_tensor(ids.astype("int64") if hasattr(ids, "astype") else ids)
            pooled.append(bag(ids, offsets[:-1]))
        return self.dense(dense, torch.stack(pooled, dim=1))

    @torch.no_grad()
    def predict(self, dense: Any, sparse: Sequence[Any]) -> torch.Tensor:
        return torch.sigmoid(self(dense, sparse))


def dlrm_from_store(store: Any, at: Any = None) -> DlrmModel:
    """ftrec's DLRM with the weights of a store's state (``store``: an ``ftrec.Store`` or its
    location; ``at`` as for ``Store.state_dict``), in eval mode. Its predictions on
    ``store.held_out()`` are ``ftrec eval``'s."""
    from . import Store

    if not isinstance(store, Store):
        store = Store(store)
    tensors = store.state_dict(at=at)
    rows, dims = [], set()
    t = 0
    while f"embedding.{t}.weight" in tensors:
        r, d = tensors[f"embedding.{t}.weight"].shape
        rows.append(r)
        dims.add(d)
        t += 1
    if len(dims) != 1:
        raise ValueError(f"the state's tables have widths {sorted(dims)}: not ftrec's DLRM")
    dim = dims.pop()

    def widths(part: str) -> List[int]:
        out, i = [], 0
        while f"{part}.{i}.weight" in tensors:
            out.append(tensors[f"{part}.{i}.weight"].shape[0])
            i += 1
        return out

    dense_features = tensors["bottom_mlp.0.weight"].shape[1]
    model = DlrmModel(rows, dim, dense_features, widths("bottom_mlp"), widths("top_mlp"))
    state = {name: torch.from_numpy(a) for name, a in tensors.items()}
    missing, unexpected = model.load_state_dict(state, strict=False)
    # The dense part's copies of the MLPs share the top-level modules' tensors.
    missing = [m for m in missing if not m.startswith("dense.")]
    if missing or unexpected:
        raise ValueError(f"the state does not fit ftrec's DLRM: missing {missing}, unexpected {unexpected}")
    return model.eval()


class DenseCheckpoints:
    """The dense part's state (a module's and, if given, its optimizer's ``state_dict``) kept
    by step, so that a rollback of the tables to a step can reload the dense part of the same
    step: ``client.on_rollback(dense.load)``. ``every`` keeps one state in that many steps
    (give the job's checkpoint interval, or 1); ``keep`` bounds how many are held in memory
    (the oldest go first). With ``store`` (an ``ftrec.Store`` or its location: the job's own
    store), each state is also written into it as ``dense/{step}.pt`` (``Store.put_blob``),
    outside the checkpoints' collection, so a trainer that restarts reloads the dense part of
    the step the tables were restored to; with ``path``, into that directory instead."""

    def __init__(self, module: nn.Module, optimizer: Optional[torch.optim.Optimizer] = None, *,
                 every: int = 1, keep: int = 64, store: Any = None,
                 path: Optional[str] = None) -> None:
        if every < 1 or keep < 1:
            raise ValueError("every and keep must be at least 1")
        if store is not None and path is not None:
            raise ValueError("give store= or path=, not both")
        if store is not None:
            from . import Store
            if not isinstance(store, Store):
                store = Store(store)
        self.module, self.optimizer = module, optimizer
        self.every, self.keep, self.store, self.path = every, keep, store, path
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
        if self.store is not None:
            import io
            buf = io.BytesIO()
            torch.save(state, buf)
            self.store.put_blob(f"dense/{step}.pt", buf.getvalue())
        elif self.path is not None:
            import os
            os.makedirs(self.path, exist_ok=True)
            torch.save(state, os.path.join(self.path, f"dense-{step}.pt"))

    def _stored(self, step: int) -> Optional[Dict[str, Any]]:
        import io
        import os
        if self.store is not None:
            data = self.store.get_blob(f"dense/{step}.pt")
            return None if data is None else torch.load(io.BytesIO(data), weights_only=False)
        if self.path is not None:
            f = os.path.join(self.path, f"dense-{step}.pt")
            if os.path.exists(f):
                return torch.load(f, weights_only=False)
        return None

    def load(self, step: int) -> None:
        """Reload the state after ``step`` (the rollback hook): from memory, else from the
        store or directory. Raises ``KeyError`` naming the steps held when there is none."""
        state = self.states.get(step)
        if state is None:
            state = self._stored(step)
        if state is None:
            raise KeyError(
                f"no dense state for step {step} (held: {sorted(self.states)}); save every "
                "step the job can roll back to (every= its checkpoint interval)")
        self.module.load_state_dict(state["module"])
        if self.optimizer is not None and "optimizer" in state:
            self.optimizer.load_state_dict(state["optimizer"])
        for s in [s for s in self.states if s > step]:
            del self.states[s]
