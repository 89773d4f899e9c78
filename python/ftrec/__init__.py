"""ftrec from Python: checkpoint stores of every strategy, their checkpoints, job record and
verification, and any committed state as NumPy arrays.

    >>> import ftrec
    >>> store = ftrec.Store("deck-store")            # a directory or s3://bucket/prefix
    >>> [c["step"] for c in store.checkpoints()]
    >>> tensors = store.state_dict(at=20)             # name -> numpy.ndarray (float32)
    >>> tensors["embedding.0.weight"].shape           # (rows, dim)

The tensors have the names and shapes of ``ftrec ckpt export``'s safetensors file. Everything
is done by the Rust crates the ``ftrec`` binary is built from (the extension module
``ftrec._ftrec``): nothing here is reimplemented in Python.

Errors: ``FileNotFoundError`` for a store directory that does not exist, ``ValueError`` for a
location that holds no store, an ``at`` that names no state of the store, or a preset or
optimizer that does not fit, ``TypeError`` for an argument of the wrong type, and
``ftrec.FtrecError`` when the store itself fails (damage, an unreachable S3 service).
"""

from ._ftrec import Batch, BatchLost, EmbeddingClient, FtrecError, Store, __version__, evaluate
from .job import Job

__all__ = ["Batch", "BatchLost", "EmbeddingClient", "FtrecError", "Job", "Store", "__version__", "evaluate"]
