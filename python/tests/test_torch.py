"""ftrec.torch on real jobs: the custom-model example (a DeepFM on the job's tables) with a
server SIGKILLed under ECRec and under DECK ends at the model of the run without the kill, and
ftrec's DLRM in PyTorch trains through the client. Skipped where PyTorch is not installed (the
default wheel is about 5 GB: scripts/peer/compare.py --install puts it in its own venv).
"""

import os
import pathlib
import subprocess
import sys

import numpy as np
import pytest

torch = pytest.importorskip("torch", reason="PyTorch is not installed in this Python")

import ftrec  # noqa: E402
import ftrec.torch  # noqa: E402
from ftrec.torch import DenseCheckpoints, Dlrm, RemoteEmbeddings  # noqa: E402

ROOT = pathlib.Path(__file__).resolve().parents[2]


def ftrec_bin():
    path = os.environ.get("FTREC_BIN") or str(ROOT / "target" / "debug" / "ftrec")
    if not os.access(path, os.X_OK):
        pytest.fail(f"no ftrec binary at {path}: build it (cargo build -p ftrec-cli) or set FTREC_BIN")
    return path


def test_the_custom_model_example_survives_a_kill_under_ecrec_and_deck():
    out = subprocess.run(
        [sys.executable, str(ROOT / "examples" / "torch_custom_model.py"), "--steps", "40",
         "--kill-step", "23", "--eval-batches", "10", "--ftrec", ftrec_bin()],
        capture_output=True, text=True, timeout=600)
    assert out.returncode == 0, out.stdout + out.stderr
    for s in ["ecrec", "deck"]:
        assert f"{s}: server 1 SIGKILLed after step 23" in out.stdout
    assert out.stdout.count("the same model: yes") == 2, out.stdout
    assert "RecoveryComplete" in out.stdout


def test_ftrecs_dlrm_trains_through_the_client(tmp_path):
    job = ftrec.Job(preset="tiny", servers=2, workers=1, steps=30, strategy="none",
                    eval_samples=0, workers_elsewhere=True, binary=ftrec_bin())
    try:
        client = ftrec.EmbeddingClient(job.control, 0)
        emb, model = RemoteEmbeddings(), Dlrm.for_client(client)
        opt = torch.optim.Adagrad(model.parameters(), lr=0.05)
        losses = []
        for batch in client:
            logits = model(torch.from_numpy(batch.dense), emb(batch))
            assert logits.shape == (client.batch_size,)
            loss = torch.nn.functional.binary_cross_entropy_with_logits(
                logits, torch.from_numpy(batch.labels))
            opt.zero_grad()
            emb.loss = loss.item()
            loss.backward()
            opt.step()
            losses.append(loss.item())
        report = job.wait(timeout=120)
    finally:
        job.stop()
    assert len(losses) == 30 and report["steps"] == 30
    # The losses the client sent are the job's.
    assert report["train_loss"] == pytest.approx(losses[-1], rel=1e-6)
    assert np.mean(losses[-10:]) < np.mean(losses[:10])


def test_a_rollback_to_a_step_without_a_dense_state_names_the_steps_held():
    model = torch.nn.Linear(2, 1)
    dense = DenseCheckpoints(model, every=5)
    dense.save(5)
    dense.save(7)
    with pytest.raises(KeyError, match=r"held: \[0, 5\]"):
        dense.load(7)
    with torch.no_grad():
        model.weight.add_(1.0)
    before = model.weight.clone()
    dense.load(5)
    assert not torch.equal(model.weight, before)


def test_dlrm_from_store_predicts_as_ftrec_eval(tmp_path):
    store = tmp_path / "store"
    run = subprocess.run(
        [ftrec_bin(), "run", "--preset", "tiny", "--servers", "2", "--steps", "30", "--sync",
         "--strategy", "full", "--ckpt-every-steps", "10", "--store", str(store),
         "--eval-samples", "4096", "--work-dir", str(tmp_path / "w")],
        capture_output=True, text=True, timeout=300)
    assert run.returncode == 0, run.stderr
    ev = subprocess.run([ftrec_bin(), "eval", "--ckpt", str(store), "--json", str(tmp_path / "e.json")],
                        capture_output=True, text=True, timeout=300)
    assert ev.returncode == 0, ev.stderr
    import json
    reference = json.loads((tmp_path / "e.json").read_text())
    s = ftrec.Store(str(store))
    held = s.held_out()
    assert held["step"] == reference["step"] and len(held["labels"]) == reference["eval_samples"]
    assert held["auc"] == reference["auc"] and held["logloss"] == reference["logloss"]
    model = ftrec.torch.dlrm_from_store(s)
    p = model.predict(held["dense"], held["sparse"]).numpy()
    assert np.allclose(p, held["predictions"], rtol=0, atol=2e-6), np.abs(p - held["predictions"]).max()
    ours = ftrec.evaluate(p.astype(np.float32), held["labels"])
    assert abs(ours["auc"] - reference["auc"]) <= 1e-6
    # The same model from an older state: the first save's step.
    older = ftrec.torch.dlrm_from_store(str(store), at=30)
    assert older.embedding[0].weight.shape == model.embedding[0].weight.shape


def test_dense_states_kept_in_the_jobs_store_reload_in_a_new_trainer(tmp_path):
    store = tmp_path / "store"
    run = subprocess.run(
        [ftrec_bin(), "run", "--preset", "tiny", "--steps", "4", "--strategy", "full",
         "--store", str(store), "--eval-samples", "0", "--work-dir", str(tmp_path / "w")],
        capture_output=True, text=True, timeout=300)
    assert run.returncode == 0, run.stderr
    torch.manual_seed(1)
    model = torch.nn.Linear(3, 1)
    opt = torch.optim.Adagrad(model.parameters())
    dense = DenseCheckpoints(model, opt, store=str(store))
    model(torch.ones(2, 3)).sum().backward()
    opt.step()
    dense.save(4)
    saved = model.weight.detach().clone()
    # A new trainer process: nothing in memory, the state read back from the store.
    fresh = torch.nn.Linear(3, 1)
    DenseCheckpoints(fresh, store=ftrec.Store(str(store)), keep=1).load(4)
    assert torch.equal(fresh.weight, saved)
    # The store still reads as the job's (the trainer's objects are outside its checkpoints).
    assert ftrec.Store(str(store)).verify()["ok"]
