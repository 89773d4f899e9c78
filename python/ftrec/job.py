"""Jobs from Python: ``ftrec run`` started with the CLI's settings, its progress and events
streamed as dicts, its report returned as a dict.

    >>> job = ftrec.Job(preset="tiny", servers=3, strategy="deck", steps=200,
    ...                 kill=["server=1@step=100"], store="deck-store")
    >>> for e in job.events():          # until the job ends
    ...     print(e["kind"], e.get("step"), e.get("message"))
    >>> report = job.wait()             # the report `ftrec run --json` writes

The job is the ``ftrec`` executable's own ``run`` (found as ``binary=``, else ``$FTREC_BIN``,
else ``ftrec`` on ``PATH``): every setting is its flag of the same name (``_`` for ``-``), so
``ftrec run --help`` documents them; this module only turns the settings into flags and reads
the records the run writes with ``--log-format json``.
"""

from __future__ import annotations

import json
import os
import queue
import shutil
import signal
import subprocess
import tempfile
import threading
from typing import Any, Dict, Iterator, List, Mapping, Optional

from ._ftrec import FtrecError

__all__ = ["Job", "find_binary"]

_EVENT = "ftrec::event"
_PROGRESS = "ftrec::progress"
# Settings that belong to this module, not to `ftrec run`.
_OWN = {"json", "log_format"}


def find_binary(binary: Optional[str] = None) -> str:
    """The ``ftrec`` executable: ``binary``, else ``$FTREC_BIN``, else ``ftrec`` on PATH."""
    for candidate, source in ((binary, "binary="), (os.environ.get("FTREC_BIN"), "$FTREC_BIN")):
        if candidate:
            if not (os.path.isfile(candidate) and os.access(candidate, os.X_OK)):
                raise FileNotFoundError(f"{source} {candidate!r} is not an executable file")
            return candidate
    found = shutil.which("ftrec")
    if found is None:
        raise FileNotFoundError(
            "no ftrec executable: build it (cargo build --release -p ftrec-cli) and give "
            "binary='target/release/ftrec', set $FTREC_BIN, or put it on PATH"
        )
    return found


def flags(settings: Mapping[str, Any]) -> List[str]:
    """``ftrec run``'s flags for ``settings``: ``key=value`` as ``--key value`` (``_`` for
    ``-``), ``True`` as ``--key``, ``False`` and ``None`` left out, a list or tuple as the flag
    repeated."""
    out: List[str] = []
    for key, value in settings.items():
        if not isinstance(key, str) or not key or key.startswith("-"):
            raise ValueError(f"setting {key!r}: give a flag's name without dashes, e.g. 'steps'")
        if key in _OWN:
            raise ValueError(
                f"setting {key!r}: the job writes its own (the report is job.wait()'s, the "
                "records job.events()')"
            )
        flag = "--" + key.replace("_", "-")
        if value is None or value is False:
            continue
        if value is True:
            out.append(flag)
            continue
        values = value if isinstance(value, (list, tuple)) else [value]
        for v in values:
            if isinstance(v, (dict, set, bytes)) or v is None or isinstance(v, bool):
                raise TypeError(f"setting {key!r}: {v!r} is not a flag's value")
            # `=` keeps a value that starts with a dash from being read as a flag.
            out.append(f"{flag}={os.fspath(v) if isinstance(v, os.PathLike) else v}")
    return out


def _record(line: str) -> Dict[str, Any]:
    """One record of the run's JSON log as an event dict."""
    try:
        rec = json.loads(line)
        fields = rec.get("fields", {})
        target = rec.get("target", "")
    except (ValueError, AttributeError):
        return {"kind": "Output", "message": line}
    out: Dict[str, Any] = dict(fields)
    if target == _EVENT:
        out["kind"] = fields.get("kind", "Event")
    elif target == _PROGRESS:
        out["kind"] = "Progress"
    else:
        out["kind"] = "Error" if rec.get("level") == "ERROR" else "Log"
    return out


class Job:
    """A running ``ftrec run``, started with ``settings`` (a dict) and keyword arguments (the
    same names; a keyword wins). Raises ``FileNotFoundError`` when no ``ftrec`` executable is
    found, ``ValueError``/``TypeError`` for a setting that is not a flag; a setting the run
    refuses ends the job at once and ``wait()`` raises ``ftrec.FtrecError`` with its message.
    """

    def __init__(self, settings: Optional[Mapping[str, Any]] = None, /, *,
                 binary: Optional[str] = None, **kwargs: Any) -> None:
        merged: Dict[str, Any] = dict(settings or {})
        merged.update(kwargs)
        self.settings = merged
        self.binary = find_binary(binary)
        self._dir = tempfile.TemporaryDirectory(prefix="ftrec-job-")
        self._report = os.path.join(self._dir.name, "report.json")
        argv = [self.binary, "run", *flags(merged), "--log-format", "json", "--json", self._report]
        self.argv = argv
        self._proc = subprocess.Popen(
            argv, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
            text=True, start_new_session=True)
        self._events: "queue.Queue[Optional[Dict[str, Any]]]" = queue.Queue()
        self._errors: List[str] = []
        self._plain: List[str] = []
        self._control: Optional[str] = None
        self._control_seen = threading.Event()
        self.output = ""
        self._reader = threading.Thread(target=self._read, name="ftrec-job-log", daemon=True)
        self._reader.start()
        self._out_reader = threading.Thread(target=self._read_out, name="ftrec-job-out",
                                            daemon=True)
        self._out_reader.start()

    def _read(self) -> None:
        assert self._proc.stderr is not None
        for line in self._proc.stderr:
            line = line.rstrip("\n")
            if not line:
                continue
            e = _record(line)
            if e["kind"] == "Error":
                self._errors.append(e.get("message", line))
            elif e["kind"] == "Output":
                # Before the log is set up (a flag refused) the run writes plain lines.
                self._plain.append(line)
            if "control" in e and self._control is None:
                self._control = str(e["control"])
                self._control_seen.set()
            self._events.put(e)
        self._control_seen.set()
        self._events.put(None)

    def _read_out(self) -> None:
        assert self._proc.stdout is not None
        self.output = self._proc.stdout.read()

    @property
    def pid(self) -> int:
        """The run's process id (its servers and workers are its children)."""
        return self._proc.pid

    @property
    def control(self) -> str:
        """The control socket's address, ``HOST:PORT``, for a job started with
        ``workers_elsewhere=True`` (where its workers, ``ftrec.EmbeddingClient``s, connect);
        waits until the run has bound it."""
        self._control_seen.wait()
        if self._control is None:
            raise FtrecError(
                "the job has no control socket to connect to (give workers_elsewhere=True)"
                + self._failure_suffix())
        return self._control

    def events(self, timeout: Optional[float] = None) -> Iterator[Dict[str, Any]]:
        """The run's records as they come, until it ends (or ``timeout`` seconds pass without
        one): ``kind`` is the timeline event (``FailureInjected``, ``FailureDetected``,
        ``ServerReplaced``, ``TrainingResumed``, ``RecoveryComplete``, ``CheckpointEnd``, ...)
        with ``step``, ``server``, ``t_s`` and ``message``; ``Progress`` with ``step``,
        ``samples`` and ``samples_per_second``; ``Log`` and ``Error`` for other lines."""
        while True:
            try:
                e = self._events.get(timeout=timeout)
            except queue.Empty:
                return
            if e is None:
                self._events.put(None)
                return
            yield e

    def poll(self) -> Optional[int]:
        """The run's exit status, or None while it runs."""
        return self._proc.poll()

    def _failure_suffix(self) -> str:
        if self._errors:
            return f": {self._errors[-1]}"
        said = [l for l in self._plain if l.strip()]
        return ": " + " ".join(l.strip() for l in said[:6]) if said else ""

    def wait(self, timeout: Optional[float] = None) -> Dict[str, Any]:
        """Wait for the run to end and return its report (``ftrec run --json``'s dict).
        Raises ``ftrec.FtrecError`` with the run's error when it failed, ``TimeoutError`` when
        ``timeout`` seconds pass first."""
        try:
            status = self._proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            raise TimeoutError(f"the job (pid {self.pid}) still runs after {timeout} s") from None
        self._reader.join()
        self._out_reader.join()
        if status != 0:
            how = f"status {status}" if status > 0 else f"signal {-status}"
            raise FtrecError(f"ftrec run ended with {how}{self._failure_suffix()}")
        with open(self._report, encoding="utf-8") as f:
            return json.load(f)

    def stop(self, timeout: float = 30.0) -> Optional[int]:
        """Stop the run (SIGTERM; SIGKILL after ``timeout`` seconds): its servers and workers
        end with it. Returns its exit status."""
        if self._proc.poll() is None:
            self._proc.send_signal(signal.SIGTERM)
            try:
                self._proc.wait(timeout=timeout)
            except subprocess.TimeoutExpired:
                self._proc.kill()
                self._proc.wait()
        self._reader.join()
        self._out_reader.join()
        return self._proc.returncode

    def __enter__(self) -> "Job":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.stop()
        self._dir.cleanup()

    def __repr__(self) -> str:
        state = "running" if self._proc.poll() is None else f"ended ({self._proc.returncode})"
        return f"ftrec.Job(pid={self.pid}, {state})"
