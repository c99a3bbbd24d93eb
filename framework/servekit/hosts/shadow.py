"""The shadow process: a worker's shadow copies, run at idle CPU priority and logged.

Started by :class:`servekit.hosts.shadow_pipe.ShadowProcess` on its worker's
first copy, as ``python -m servekit.hosts.shadow FRAMES ANSWERS CONFIG BOARD`` (two
pipe descriptors, a JSON document: the ``--plugin`` entries, the request log's store
and the log level, and the descriptor of the worker's concurrency board, ``-1`` for
none).  Once started and its first candidate loaded, it puts every thread of it at
``SCHED_IDLE`` (where refused, nice 19), so it computes only on CPU time the serving
processes leave idle.  It reads its worker's frames one at a time (the format is
:mod:`.shadow_pipe`'s; ahead of their turn only to keep the pipe from filling), and
starts a copy in a pause of its worker's traffic (:class:`WorkerIdle`).

For each copy it loads the candidate version as a model host would (plugins,
``model.py``, the version's settings as its worker loaded them: :class:`Candidates`
keeps the last :data:`KEEP` loaded, by name, version, folder, fingerprint and
settings, so a version replaced in the worker is loaded anew here), runs the
request through a data plane of its own (the input checks, the load signal and
the statistics of any ``predict``), joins a stream, measures the
:func:`~servekit.dataplane.traffic.difference` from the served answer, and logs
:func:`~servekit.dataplane.traffic.shadow_record` through every ``log_request``
plugin it has: the built-in store (its own spool, in the folder its worker's
store spools to) and any plugin the server loads by itself or with ``--plugin``.

It exits when its pipe ends (the worker closed it, or the worker is gone) or,
checked between frames and every second while idle, when its worker is no longer
its parent; before exiting it ships what it logged to the store.  A copy that
runs on 10 s after its worker is gone (a model stuck in its ``predict``) does
not keep it alive: a watching thread ends it.
"""

from __future__ import annotations

import collections
import json
import logging
import mmap
import os
import signal
import sys
import threading
import time
from pathlib import Path
from typing import Any

from servekit.hosts.shadow_pipe import TOKEN, FrameReader, decode, idle_priority, pipe_size

log = logging.getLogger("servekit.hosts")

#: candidates kept loaded in one shadow process (the least recently used goes first)
KEEP = 4


class Candidates:
    """The candidate versions loaded here, by key; a load that failed is remembered as its error."""

    def __init__(self, pm: Any, keep: int = KEEP):
        self.pm = pm
        self.keep = keep
        self.specs: dict[str, dict[str, Any]] = {}
        self.loaded: collections.OrderedDict[str, Any] = collections.OrderedDict()

    def get(self, key: str) -> tuple[Any, Any]:
        """The data plane and version of candidate ``key``; raises what its load raised."""
        from servekit.errors import NotReady

        entry = self.loaded.get(key)
        if entry is None:
            spec = self.specs.get(key)
            if spec is None:
                raise NotReady("the shadow process was not sent this candidate's settings")
            try:
                entry = self._load(spec)
            except Exception as exc:
                entry = f"the shadow process could not load it: {type(exc).__name__}: {exc}"
                log.error("shadow candidate %s version %s: %s", spec["name"], spec["version"], entry)
            self.loaded[key] = entry
            while len(self.loaded) > self.keep:
                _, old = self.loaded.popitem(last=False)
                self._release(old)
        self.loaded.move_to_end(key)
        if isinstance(entry, str):
            raise NotReady(entry)
        return entry[1], entry[2]

    def _load(self, spec: dict[str, Any]) -> tuple[Any, Any, Any]:
        from servekit.dataplane.data_plane import DataPlane
        from servekit.dataplane.repository import ModelRepository
        from servekit.types import BatchingConfig

        repo = ModelRepository(
            {spec["name"]: Path(spec["base_path"])},
            self.pm,
            poll_interval=0,
            batching=BatchingConfig(*spec["batching"]),
        )
        mv = repo.load_one(
            spec["name"], spec["version"], Path(spec["path"]), spec["fingerprint"], spec.get("config") or {}
        )
        if not mv.ready:
            raise RuntimeError(mv.error or "the model did not load")
        log.info("shadow candidate %s version %s loaded (pid %d)", mv.name, mv.version, os.getpid())
        return repo, DataPlane(repo), mv

    @staticmethod
    def _release(entry: Any) -> None:
        if isinstance(entry, tuple):
            repo, _, mv = entry
            repo._release(mv)  # its unload hook: a candidate no longer copied to frees what it holds


class Shadow:
    """Runs copies and logs their answers (one frame at a time, in the order the worker wrote them)."""

    def __init__(self, config: dict[str, Any]):
        from servekit.hooks import manager as plugins
        from servekit.observability import metrics

        self.pm = plugins.build_manager(config.get("plugins") or [])
        self.pm.register(metrics.BatchSizePlugin(None), name="servekit.metrics")  # type: ignore[arg-type]
        self.store: Any = None
        if config.get("store"):
            from servekit.observability.log_store import SqlRequestLog

            url, spool = config["store"]
            self.store = SqlRequestLog(url, spool)
            self.pm.register(self.store, name="servekit.request_log")
        self.candidates = Candidates(self.pm)

    def handle(self, message: tuple[Any, ...], answers: int) -> None:
        kind = message[0]
        if kind == "copy":
            self.copy(*message[1:])
        elif kind == "sync":
            self.flush()
            os.write(answers, TOKEN.pack(message[1]))
        else:
            log.warning("shadow process: unknown frame %r", kind)

    def copy(
        self,
        key: str,
        spec: dict[str, Any] | None,
        inputs: Any,
        kwargs: dict[str, Any],
        served: Any,
        served_log_id: str,
        model: str,
        path: str,
        submitted: float,  # when the worker handed it in: what WorkerIdle waited by, before this
    ) -> None:
        from servekit.dataplane import traffic
        from servekit.errors import ServekitError
        from servekit.observability import request_log

        if spec is not None:
            self.candidates.specs[key] = spec
        known = self.candidates.specs.get(key) or {}
        name, version = known.get("name", model), str(known.get("version", ""))
        started = time.perf_counter()
        status, answer, diff = 200, None, None
        try:
            answer = self.answer(key, inputs, kwargs)
            diff = traffic.difference(served, answer)
        except ServekitError as exc:
            status, answer = exc.status, {"error": exc.message}
        except Exception as exc:
            status, answer = 500, {"error": f"{type(exc).__name__}: {exc}"}
        record = traffic.shadow_record(
            served_log_id=served_log_id,
            served=served,
            answer=answer,
            status=status,
            difference=diff,
            model=name,
            version=version,
            path=path,
            duration_ms=(time.perf_counter() - started) * 1000,
        )
        request_log.emit(self.pm, record)

    def prepare(self, key: str, spec: dict[str, Any] | None) -> None:
        """Load a copy's candidate ahead of the copy (its error, if any, is the copy's answer then)."""
        from servekit.errors import ServekitError

        if spec is not None:
            self.candidates.specs[key] = spec
        try:
            self.candidates.get(key)
        except ServekitError:
            pass

    def answer(self, key: str, inputs: Any, kwargs: dict[str, Any]) -> Any:
        """The candidate's answer to the copy, as named outputs (a stream joined)."""
        from servekit.dataplane.data_plane import DEFAULT_OUTPUT, join_stream
        from servekit.streams import is_stream

        dataplane, mv = self.candidates.get(key)
        result = dataplane.predict(mv, inputs, **kwargs)
        if is_stream(result):
            result = join_stream(result)
        return result if isinstance(result, dict) else {DEFAULT_OUTPUT: result}

    def flush(self) -> None:
        """Everything logged so far is in the store."""
        if self.store is not None and not self.store.flush(30.0):
            log.warning("shadow process: the request log's store did not take the records in 30 s")

    def close(self) -> None:
        """Before exiting: the records shipped, the counters written, this process's live gauges gone."""
        from servekit.observability import load, metrics, statistics

        self.flush()
        for flush in (statistics.flush, metrics.flush, load.flush):
            try:
                flush()
            except Exception:
                log.exception("shadow process: writing its counters failed")
        metrics.mark_process_dead(os.getpid())


def _outlive_no_worker(parent: int, grace: float = 10.0) -> None:
    """A thread's watch: a worker gone while a copy runs on (a model stuck in its ``predict``)
    ends this process ``grace`` seconds later, whatever it is doing (its spool stays for another
    process sharing the folder to ship)."""
    while os.getppid() == parent:
        time.sleep(1.0)
    time.sleep(grace)
    log.warning("shadow process %d: its worker %d is gone and a copy still runs; exiting", os.getpid(), parent)
    os._exit(1)


#: a copy runs once its worker has answered every request for this long at a stretch (the gaps of
#: a few ms between a busy worker's requests are no pause: with 2 ms, most of bench/shadow.py's
#: copies ran during its bursts, beside the served requests) ...
QUIET_S = 0.02
#: ... or once it has waited this long since the worker handed it in (its record is in the request
#: log within about this much, however busy the worker stays) ...
DEFER_S = 5.0
#: ... and once the copies waiting fill this share of the pipe, they are read out of it into this
#: process's memory, up to :data:`SPILL_BYTES`, so that the worker finds room and drops none; past
#: that they run at once (under a load that never pauses, beside it, rather than being dropped)
BACKLOG_SHARE = 0.5
SPILL_BYTES = 64 << 20
#: how often the board is looked at while a copy waits, and the pipe's fill
BOARD_POLL_S = 0.005
BACKLOG_POLL_S = 0.05


class WorkerIdle:
    """Hands out the worker's frames in order and waits, before each copy, until the worker has
    held no request for :data:`QUIET_S` (its concurrency on the shared board is 0), or until the
    copy is :data:`DEFER_S` old, or until the copies waiting fill :data:`SPILL_BYTES`, whichever
    comes first.  ``SCHED_IDLE`` keeps a copy from taking a CPU a serving thread wants, but not
    from slowing it: on the 2 CPUs of a small VM a loop at idle priority on one CPU made single
    requests on the other 8-11 % slower (bench/shadow.py, RESULTS.md).  So copies wait for the
    pauses in the worker's traffic, and a burst's copies run in the pause after it."""

    def __init__(self, board_fd: int, reader: FrameReader | None = None):
        self.board = mmap.mmap(board_fd, 8, prot=mmap.PROT_READ) if board_fd >= 0 else None
        self.reader = reader
        self.capacity = pipe_size(reader.fd) if reader is not None else 0
        #: since when the worker has held no request, as last seen (kept from one copy to the next:
        #: in a pause, the copies waiting run back to back)
        self.quiet_since: float | None = None
        #: frames read out of the pipe ahead of their turn, and their bytes
        self.spilled: collections.deque[bytes] = collections.deque()
        self.spilled_bytes = 0
        self.ended = False

    def next_frame(self) -> bytes | None:
        """The worker's next frame (:func:`decode` it); ``None`` once they have all been handed out."""
        if self.spilled:
            body = self.spilled.popleft()
            self.spilled_bytes -= len(body)
            return body
        if self.ended or self.reader is None:
            return None
        return self.reader.read()

    def wait(self, submitted: float) -> None:
        """Before the copy the worker handed in at ``submitted`` (``time.monotonic()``, one clock
        for every process of the machine) runs."""
        if self.board is None:
            return
        from servekit.observability.load import read_board

        until = submitted + DEFER_S
        backlog_at = 0.0
        while True:
            now = time.monotonic()
            if read_board(self.board) > 0:
                self.quiet_since = None
            elif self.quiet_since is None:
                self.quiet_since = now
            elif now - self.quiet_since >= QUIET_S:
                return
            if now >= until:
                return
            if now >= backlog_at:
                backlog_at = now + BACKLOG_POLL_S
                if self._backlog() >= BACKLOG_SHARE and not self._spill():
                    return
            time.sleep(BOARD_POLL_S)

    def _backlog(self) -> float:
        """The share of the pipe the copies waiting fill (0 where it cannot be told)."""
        if self.reader is None or self.capacity <= 0:
            return 0.0
        from servekit.hosts.shadow_pipe import unread

        try:
            return unread(self.reader.fd) / self.capacity
        except OSError:
            return 0.0

    def _spill(self) -> bool:
        """Read the frames in the pipe into memory, up to :data:`SPILL_BYTES`; whether there was room."""
        from servekit.hosts.shadow_pipe import unread

        assert self.reader is not None
        while self.spilled_bytes < SPILL_BYTES and not self.ended and unread(self.reader.fd) > 0:
            body = self.reader.read()  # a frame is written whole: this one is in the pipe already
            if body is None:
                self.ended = True
                break
            self.spilled.append(body)
            self.spilled_bytes += len(body)
        return self.spilled_bytes < SPILL_BYTES


def idle_every_thread() -> str:
    """Put every thread of this process at idle priority (:func:`.shadow_pipe.idle_priority`; a
    thread started later takes its starter's); which priority that was."""
    tasks = Path("/proc/self/task")
    if not tasks.is_dir():
        return idle_priority()
    return [idle_priority(int(task.name)) for task in tasks.iterdir()][-1]


def main(argv: list[str]) -> int:
    frames, answers, config = int(argv[0]), int(argv[1]), json.loads(argv[2])
    parent = os.getppid()
    # a terminal's Ctrl-C reaches the whole group: the worker decides when this process ends
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(0))
    logging.basicConfig(
        level=str(config.get("log_level") or "INFO").upper(),
        format="[%(asctime)s] [%(process)d] [%(levelname)s] %(name)s: %(message)s",
    )
    threading.Thread(target=_outlive_no_worker, args=(parent,), name="servekit-shadow-watch", daemon=True).start()
    shadow = Shadow(config)
    reader = FrameReader(frames, alive=lambda: os.getppid() == parent)
    idle = WorkerIdle(int(argv[3]) if len(argv) > 3 else -1, reader)
    # Started, and its first candidate loaded, at its worker's priority: at idle priority under a
    # load that never paused it took seconds to start, while the copies filled the pipe and were
    # dropped. From its first copy on, every thread of it is at idle priority.
    priority = ""
    try:
        while (body := idle.next_frame()) is not None:
            try:
                message = decode(body)
                if message[0] == "copy":
                    if not priority:
                        shadow.prepare(message[1], message[2])
                        priority = idle_every_thread()
                        log.debug("shadow process %d for worker %d at %s", os.getpid(), parent, priority)
                    idle.wait(message[-1])
                shadow.handle(message, answers)
            except Exception:
                log.exception("shadow process: a copy failed to log")
    finally:
        shadow.close()
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
