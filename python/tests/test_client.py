"""ftrec.Job and ftrec.EmbeddingClient against real `ftrec run`s (the tiny preset, 3 servers,
one worker, --sync): a model written in NumPy trains on the job's embedding tables through the
client, and a server SIGKILLed mid-run ends, for every strategy, at the model the same job
reaches without the kill: the servers' digest (`model_digest` of the job's report) and the
trainer's own dense weights bit for bit. ECRec and CPR-free strategies recover without a
rollback of the trainer; `full` and `deck` roll the tables back and call the trainer's hook
with the restored step, where it reloads its dense weights.

The binary is $FTREC_BIN (scripts/python.sh sets it), else target/debug/ftrec of the checkout.
"""

import os
import pathlib

import numpy as np
import pytest

import ftrec

ROOT = pathlib.Path(__file__).resolve().parents[2]
STEPS = 24
KILL_STEP = 13


def ftrec_bin():
    path = os.environ.get("FTREC_BIN") or str(ROOT / "target" / "debug" / "ftrec")
    if not os.access(path, os.X_OK):
        pytest.fail(f"no ftrec binary at {path}: build it (cargo build -p ftrec-cli) or set FTREC_BIN")
    return path


def job(tmp_path, strategy, kill=None, **extra):
    settings = dict(preset="tiny", servers=3, workers=1, sync=True, steps=STEPS, seed=5,
                    strategy=strategy, eval_samples=0, workers_elsewhere=True,
                    work_dir=tmp_path / f"work-{strategy}-{bool(kill)}")
    settings.update(extra)
    if kill:
        settings["kill"] = [kill]
    return ftrec.Job(settings, binary=ftrec_bin())


class LogisticOnEmbeddings:
    """A model that is not ftrec's DLRM: logistic regression on the pooled rows and the dense
    features, its weights in NumPy, plain SGD; every batch's weights kept so a rollback to any
    step can reload them."""

    def __init__(self, client, lr=0.05):
        self.lr = lr
        width = client.tables * client.dim + client.dense_features
        self.w = np.random.default_rng(11).normal(0, 0.01, width).astype(np.float32)
        self.snapshots = {0: self.w.copy()}
        self.rollbacks = []
        self.lost = 0
        self.client = client
        client.on_rollback(self.rollback)

    def rollback(self, step):
        self.rollbacks.append(step)
        self.w = self.snapshots[step].copy()

    def train(self):
        for batch in self.client:
            try:
                pooled = batch.lookup()
                b, t, d = pooled.shape
                x = np.concatenate([pooled.reshape(b, t * d), batch.dense], axis=1)
                p = 1.0 / (1.0 + np.exp(-(x @ self.w)))
                y = batch.labels
                loss = float(-np.mean(y * np.log(p + 1e-7) + (1 - y) * np.log(1 - p + 1e-7)))
                g = ((p - y) / b).astype(np.float32)
                grad_pooled = np.outer(g, self.w[: t * d]).reshape(b, t, d).astype(np.float32)
                batch.send(grad_pooled, loss)
            except ftrec.BatchLost:
                self.lost += 1
                continue
            self.w = self.w - self.lr * (x.T @ g).astype(np.float32)
            self.snapshots[batch.index] = self.w.copy()
        return self


def train(tmp_path, strategy, kill=None, **extra):
    j = job(tmp_path, strategy, kill, **extra)
    try:
        client = ftrec.EmbeddingClient(j.control, 0)
        assert (client.tables, client.batch_size, client.workers) == (26, 128, 1)
        model = LogisticOnEmbeddings(client).train()
        report = j.wait(timeout=300)
        events = list(j.events(timeout=0))
    finally:
        j.stop()
    return model, report, events


@pytest.mark.parametrize(
    "strategy,extra,rolls_back",
    [
        ("ecrec", {}, False),
        ("full", {"ckpt_every_steps": 5}, True),
        ("deck", {"delta_every_steps": 4}, True),
    ],
)
def test_a_server_kill_ends_at_the_failure_free_model(tmp_path, strategy, extra, rolls_back):
    clean, clean_report, _ = train(tmp_path, strategy, **extra)
    assert clean.rollbacks == [] and clean.lost == 0
    killed, report, events = train(tmp_path, strategy, f"server=1@step={KILL_STEP}", **extra)
    kinds = [e["kind"] for e in events]
    assert "FailureInjected" in kinds and "RecoveryComplete" in kinds, kinds
    assert len(report["failures"]) == 1
    if rolls_back:
        assert len(killed.rollbacks) == 1
        assert killed.rollbacks[0] < KILL_STEP
    else:
        assert killed.rollbacks == []
    assert report["model_digest"] == clean_report["model_digest"]
    assert np.array_equal(killed.w, clean.w)
    assert report["steps"] == STEPS


def test_a_job_streams_progress_and_events_and_returns_its_report(tmp_path):
    j = ftrec.Job(preset="tiny", steps=30, servers=2, strategy="full", ckpt_every_steps=10,
                  kill=["server=0@step=15"], eval_samples=0, report_interval_s=0.05,
                  work_dir=tmp_path / "w", binary=ftrec_bin())
    events = list(j.events())
    report = j.wait()
    kinds = [e["kind"] for e in events]
    for k in ["ServersStarted", "FailureInjected", "FailureDetected", "TrainingResumed",
              "CheckpointEnd"]:
        assert k in kinds, kinds
    progress = [e for e in events if e["kind"] == "Progress"]
    assert progress and all(e["samples_per_second"] > 0 for e in progress)
    assert report["steps"] == 30 and len(report["failures"]) == 1
    assert j.poll() == 0


def test_a_setting_the_run_refuses_raises_its_message(tmp_path):
    j = ftrec.Job(preset="tiny", no_such_flag=3, binary=ftrec_bin())
    with pytest.raises(ftrec.FtrecError, match="no-such-flag"):
        j.wait(timeout=60)
    with pytest.raises(ValueError, match="without dashes"):
        ftrec.Job({"--steps": 3}, binary=ftrec_bin())
    with pytest.raises(FileNotFoundError, match="not an executable"):
        ftrec.Job(binary=str(tmp_path / "nothing"))


def test_bad_gradients_raise_and_the_batch_stays_open(tmp_path):
    j = job(tmp_path, "none", steps=3)
    try:
        client = ftrec.EmbeddingClient(j.control, 0)
        batch = next(iter(client))
        pooled = batch.lookup()
        with pytest.raises(ValueError, match="shape"):
            batch.send(np.zeros((2, 2, 2), np.float32))
        with pytest.raises(TypeError, match="float32"):
            batch.send(pooled.astype(np.float64))
        with pytest.raises(ValueError, match="non-finite"):
            batch.send(np.full_like(pooled, np.nan))
        with pytest.raises(RuntimeError, match="still open"):
            next(iter(client))
        batch.send(np.zeros_like(pooled), 0.5)
        with pytest.raises(RuntimeError, match="closed"):
            batch.lookup()
        for b in client:
            b.send(np.zeros_like(b.lookup()), 0.5)
        assert j.wait(timeout=120)["steps"] == 3
    finally:
        j.stop()
    with pytest.raises(ValueError, match="coordinator"):
        ftrec.EmbeddingClient("no port", 0)
