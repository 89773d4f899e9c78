"""ftrec.Store on the stores real `ftrec run`s write, one per strategy kind: full checkpoints,
DECK deltas and IncrCP's incremental pieces (the tiny preset, 2 servers, 2 workers, --sync).

What the binary says about a store is the reference: `ftrec ckpt ls` for the listing,
`ftrec ckpt verify` for the check, and `ftrec ckpt export`'s safetensors file for the tensors,
which must equal `state_dict()`'s bit for bit (read back with safetensors' NumPy loader).

The binary is $FTREC_BIN (scripts/python.sh sets it), else target/debug/ftrec of the checkout.
"""

import os
import pathlib
import re
import shutil
import subprocess

import numpy as np
import pytest
from safetensors.numpy import load_file

import ftrec

ROOT = pathlib.Path(__file__).resolve().parents[2]
STEPS = 8
SEED = 3
STRATEGIES = {
    "full": ["--strategy", "full", "--ckpt-every-steps", "4"],
    # No merging: every delta stays a state of its own, so earlier steps can be read back.
    "deck": ["--strategy", "deck", "--delta-every-steps", "3", "--merge-stride", "0"],
    # No new base: §4.5's rule prices a save by its measured pause, so it may reset on a loaded
    # machine, and the collection would then drop the pieces before it.
    "incrcp": ["--strategy", "incrcp", "--ckpt-every-steps", "3", "--base-reset", "never"],
}
# The states each store keeps: every save and the last step's, but a full store's collection
# keeps the newest full only.
KEPT_STEPS = {"full": [8], "deck": [3, 6, 8], "incrcp": [3, 6, 8]}
# The strategy as the job record names it.
RECORDED = {"full": "full", "deck": "deck", "incrcp": "incr_cp"}


def ftrec_bin():
    path = os.environ.get("FTREC_BIN") or str(ROOT / "target" / "debug" / "ftrec")
    if not os.access(path, os.X_OK):
        pytest.fail(
            f"no ftrec binary at {path}: build it (cargo build -p ftrec-cli) or set FTREC_BIN"
        )
    return path


def ftrec_cli(*args, check=True):
    out = subprocess.run(
        [ftrec_bin(), *map(str, args)], capture_output=True, text=True, timeout=300
    )
    if check and out.returncode != 0:
        raise AssertionError(
            f"ftrec {' '.join(map(str, args))} exited {out.returncode}:\n{out.stderr}"
        )
    return out


@pytest.fixture(scope="module")
def stores(tmp_path_factory):
    """Strategy name -> the store of a run of it."""
    base = tmp_path_factory.mktemp("stores")
    out = {}
    for name, flags in STRATEGIES.items():
        store = base / f"{name}-store"
        ftrec_cli(
            "run", "--preset", "tiny", "--servers", 2, "--workers", 2, "--sync",
            "--steps", STEPS, "--batch", 32, "--eval-samples", 64, "--seed", SEED,
            "--work-dir", base / f"{name}-work", *flags, "--store", store,
        )
        out[name] = store
    return out


def export(store, out, *args):
    ftrec_cli("ckpt", "export", store, "--out", out, *args)
    return load_file(str(out))


def assert_same_tensors(got, expected):
    assert sorted(got) == sorted(expected)
    for name, want in expected.items():
        a = got[name]
        assert isinstance(a, np.ndarray), name
        assert a.dtype == np.float32, name
        assert a.shape == want.shape, name
        assert a.flags.c_contiguous, name
        # Bit for bit: NaNs and signed zeros included.
        assert np.array_equal(a.view(np.uint32), want.view(np.uint32)), name


LS_LINE = re.compile(r"^([*+ ]) (\S+)\s+(\w+)\s+L(\d+) step\s+(\d+)\s+(\d+) B")


@pytest.mark.parametrize("strategy", STRATEGIES)
def test_checkpoints_are_what_ls_lists(stores, strategy):
    store = ftrec.Store(stores[strategy])
    listed = store.checkpoints()
    assert listed, "no checkpoints"
    ls = [LS_LINE.match(line) for line in ftrec_cli("ckpt", "ls", stores[strategy]).stdout.splitlines()]
    ls = [m.groups() for m in ls if m]
    assert [(c["id"], c["kind"], c["layer"], c["step"], c["bytes"]) for c in listed] == [
        (id, kind, int(layer), int(step), int(b)) for _, id, kind, layer, step, b in ls
    ]
    assert [c["current"] for c in listed] == [mark == "*" for mark, *_ in ls]
    assert [c["live"] or c["current"] for c in listed] == [mark in "*+" for mark, *_ in ls]
    assert sorted({c["step"] for c in listed}) == KEPT_STEPS[strategy]
    (current,) = [c for c in listed if c["current"]]
    assert current["step"] == STEPS
    assert all(c["bytes"] > 0 for c in listed)
    if strategy == "incrcp":
        assert any(c["scheme"] is not None for c in listed)


@pytest.mark.parametrize("strategy", STRATEGIES)
def test_the_job_record_is_the_runs_settings(stores, strategy):
    job = ftrec.Store(stores[strategy]).job()
    assert isinstance(job, dict)
    assert job["seed"] == SEED
    assert job["steps"] == STEPS
    assert job["servers"] == 2
    assert job["workers"] == 2
    assert job["batch"] == 32
    assert job["preset"]["name"] == "tiny"
    assert job["strategy"]["name"] == RECORDED[strategy]
    # What belongs to one invocation is not recorded.
    assert "store" not in job and "kills" not in job


@pytest.mark.parametrize("strategy", STRATEGIES)
def test_verify_finds_an_intact_store_as_the_binary_does(stores, strategy):
    check = ftrec.Store(stores[strategy]).verify()
    assert check["ok"] is True and check["problems"] == 0, check["report"]
    assert check["incremental"] == (strategy == "incrcp")
    assert check["checkpoints"] and all(c["ok"] for c in check["checkpoints"])
    assert check["broken"] is None
    assert check["report"] == ftrec_cli("ckpt", "verify", stores[strategy]).stdout


@pytest.mark.parametrize("strategy", STRATEGIES)
def test_state_dict_is_the_export_bit_for_bit(stores, strategy, tmp_path):
    store = ftrec.Store(stores[strategy])
    newest = store.state_dict()
    assert_same_tensors(newest, export(stores[strategy], tmp_path / "newest.safetensors"))
    # The file's names and shapes, in its documented order.
    names = list(newest)
    assert names[:2] == ["bottom_mlp.0.weight", "bottom_mlp.0.bias"]
    assert names[-1] == "embedding.25.weight"
    assert newest["embedding.0.weight"].shape[1] == 8
    # With the optimizer state (row-wise Adagrad: one word a row; Adagrad: 256 a dense block).
    with_state = store.state_dict(optimizer_state=True)
    assert_same_tensors(
        with_state,
        export(stores[strategy], tmp_path / "state.safetensors", "--optimizer-state"),
    )
    assert with_state["embedding.0.optimizer_state"].shape[1] == 1
    assert with_state["dense.optimizer_state"].shape[1] == 256


@pytest.mark.parametrize("strategy", ["deck", "incrcp"])
def test_an_earlier_state_by_step_or_id(stores, strategy, tmp_path):
    store = ftrec.Store(stores[strategy])
    first = min(store.checkpoints(), key=lambda c: c["step"])
    assert first["step"] < STEPS
    by_step = store.state_dict(at=first["step"])
    assert_same_tensors(
        by_step,
        export(stores[strategy], tmp_path / "early.safetensors", "--at", first["step"]),
    )
    # The same state by its id, and by its step as a string (as --at reads it).
    assert_same_tensors(store.state_dict(at=first["id"]), by_step)
    assert_same_tensors(store.state_dict(at=str(first["step"])), by_step)
    # Training moved the model on after it.
    newest = store.state_dict()
    assert not np.array_equal(newest["top_mlp.1.weight"], by_step["top_mlp.1.weight"])


def test_arrays_are_the_callers_own(stores):
    store = ftrec.Store(stores["full"])
    a = store.state_dict()
    b = store.state_dict()
    a["embedding.0.weight"][0, 0] += 1.0
    assert a["embedding.0.weight"][0, 0] != b["embedding.0.weight"][0, 0]
    assert a["embedding.0.weight"].flags.writeable


def test_a_store_opens_from_a_path_object_and_says_where_it_is(stores):
    store = ftrec.Store(pathlib.Path(stores["deck"]))
    assert store.location == str(stores["deck"])
    assert str(stores["deck"]) in repr(store)
    assert ftrec.__version__


def test_a_location_that_is_no_store_is_refused_by_name(tmp_path):
    missing = tmp_path / "no-such-store"
    with pytest.raises(FileNotFoundError, match="checkpoint store .*no-such-store does not exist"):
        ftrec.Store(str(missing))
    assert not missing.exists()
    empty = tmp_path / "empty"
    empty.mkdir()
    with pytest.raises(ValueError, match="is not a checkpoint store"):
        ftrec.Store(empty)
    assert list(empty.iterdir()) == []
    afile = tmp_path / "a-file"
    afile.write_text("x")
    with pytest.raises(ValueError, match="is not a directory"):
        ftrec.Store(afile)
    with pytest.raises(ValueError, match="unsupported scheme"):
        ftrec.Store("gs://bucket/x")
    with pytest.raises(TypeError):
        ftrec.Store(42)
    with pytest.raises(TypeError):
        ftrec.Store(str(empty), endpoint=3)


def test_an_at_that_names_no_state_is_refused_with_the_states_there(stores):
    store = ftrec.Store(stores["deck"])
    with pytest.raises(ValueError, match=r"has no state at step 7 \(its states are at steps 3, 6, 8\): give at one"):
        store.state_dict(at=7)
    # A full store keeps its newest full only: step 4's was collected.
    with pytest.raises(ValueError, match=r"has no state at step 4 \(its one state is at step 8\)"):
        ftrec.Store(stores["full"]).state_dict(at=4)
    with pytest.raises(ValueError, match="has no state 00000000000000000099-full"):
        store.state_dict(at="00000000000000000099-full")
    with pytest.raises(ValueError, match=r'^at "\.\./x": '):
        store.state_dict(at="../x")
    with pytest.raises(ValueError, match="at=-1: a step is a whole number"):
        store.state_dict(at=-1)
    with pytest.raises(ValueError, match="a step is a whole number"):
        store.state_dict(at=2**70)
    with pytest.raises(TypeError, match="not float"):
        store.state_dict(at=1.5)
    with pytest.raises(TypeError, match="not a bool"):
        store.state_dict(at=True)
    with pytest.raises(TypeError):
        store.state_dict(optimizer_state="yes")
    with pytest.raises(TypeError):
        store.state_dict(4, 8)


def test_a_preset_or_optimizer_that_does_not_fit_is_refused_by_its_argument(stores):
    store = ftrec.Store(stores["full"])
    with pytest.raises(ValueError, match='^preset "huge": '):
        store.state_dict(preset="huge")
    with pytest.raises(ValueError, match="not preset small's shape"):
        store.state_dict(preset="small")
    with pytest.raises(ValueError, match=r"\(name the run's with optimizer\)"):
        store.state_dict(optimizer="adam")
    with pytest.raises(ValueError, match='^dense_optimizer "lion": '):
        store.state_dict(dense_optimizer="lion")
    # The run's own settings are accepted when given.
    assert "embedding.0.weight" in store.state_dict(
        preset="tiny", optimizer="rowwise_adagrad", dense_optimizer="adagrad"
    )


def test_damage_is_reported_by_verify_and_raised_by_a_restore(stores, tmp_path):
    copy = tmp_path / "damaged"
    shutil.copytree(stores["deck"], copy)
    store = ftrec.Store(copy)
    current = [c for c in store.checkpoints() if c["current"]][0]["id"]
    # Flip one byte in the middle of the largest file of the newest delta.
    files = [p for p in (copy / "ckpt" / current).rglob("*") if p.is_file() and p.name != "MANIFEST"]
    victim = max(files, key=lambda p: p.stat().st_size)
    data = bytearray(victim.read_bytes())
    data[len(data) // 2] ^= 0x40
    victim.write_bytes(bytes(data))
    check = store.verify()
    assert check["ok"] is False and check["problems"] >= 1
    (bad,) = [c for c in check["checkpoints"] if not c["ok"]]
    assert bad["id"] == current and bad["problem"]
    assert f"DAMAGED {current}" in check["report"]
    assert check["report"] == ftrec_cli("ckpt", "verify", copy, check=False).stdout
    with pytest.raises(ftrec.FtrecError, match=f"restoring from {copy}"):
        store.state_dict()
    # The older state is intact and still reads.
    assert "embedding.0.weight" in store.state_dict(at=6)


@pytest.mark.parametrize("strategy", STRATEGIES)
def test_the_held_out_set_and_its_predictions_are_ftrec_evals(stores, strategy, tmp_path):
    out = tmp_path / "eval.json"
    ftrec_cli("eval", "--ckpt", stores[strategy], "--json", out)
    import json
    reference = json.loads(out.read_text())
    held = ftrec.Store(stores[strategy]).held_out()
    n = reference["eval_samples"]
    assert held["step"] == reference["step"] == STEPS
    assert held["dense"].shape == (n, 13) and held["labels"].shape == (n,)
    assert len(held["sparse"]) == 26
    for offsets, ids in held["sparse"]:
        assert offsets.dtype == np.uint32 and ids.dtype == np.uint64
        assert offsets[0] == 0 and offsets[-1] == len(ids) and len(offsets) == n + 1
    assert (held["auc"], held["logloss"]) == (reference["auc"], reference["logloss"])
    again = ftrec.evaluate(held["predictions"], held["labels"])
    assert (again["auc"], again["logloss"]) == (reference["auc"], reference["logloss"])


def test_evaluate_refuses_arrays_that_do_not_pair():
    with pytest.raises(ValueError, match="one label per probability"):
        ftrec.evaluate(np.zeros(3, np.float32), np.zeros(2, np.float32))
    with pytest.raises(TypeError):
        ftrec.evaluate(np.zeros(3, np.float64), np.zeros(3, np.float32))


def test_a_trainers_objects_round_trip_beside_the_checkpoints(stores):
    store = ftrec.Store(stores["deck"])
    assert store.get_blob("dense/3.pt") is None
    store.put_blob("dense/3.pt", b"\x00state")
    assert store.get_blob("dense/3.pt") == b"\x00state"
    store.put_blob("dense/3.pt", b"newer")
    assert store.get_blob("dense/3.pt") == b"newer"
    assert store.verify()["ok"]
    for bad in ["", "/abs", "a/../b", "a//b"]:
        with pytest.raises(ValueError, match="relative path"):
            store.put_blob(bad, b"x")
