"""The event loop of a model host whose version batches: one thread, every connection, batches of what waits.

A thread per connection costs the host a thread wake-up and a GIL hand-off per
request, and the batcher's leader another; for a model whose ``predict`` takes
tens of microseconds that is most of the host's time.  Here one thread waits on
every worker connection at once (``epoll``), reads each request that has
arrived, runs the ``predict`` requests among them together
(:meth:`~servekit.dataplane.executor.LocalExecutor.predict_together`: the batcher's rules,
in this thread) and writes the answers.  Requests that arrive while a call runs
wait in their sockets and make the next batch: adaptive batching with no timer
and no batching thread, and a lone request never waits.

Anything else (``explain``, the OpenAI hooks, a streaming answer) goes to a
thread of its own, its connection out of the loop until the answer is sent.
New connections are accepted and greeted by a thread beside the loop, so a
worker's new connection is ready, and its request waiting in the socket for the
next batch, even while a long call holds the loop.
"""

from __future__ import annotations

import contextlib
import functools
import logging
import queue
import selectors
import socket
import threading
import time
from collections.abc import Callable
from typing import Any

from servekit.hosts import channel
from servekit.hosts.calls import Op
from servekit.hosts.channel import arguments, error_of
from servekit.observability import tracing
from servekit.streams import is_stream

log = logging.getLogger("servekit.hosts")


#: The longest a new connection may take to send its greeting.
GREETING_SECONDS = 10.0


class Peer:
    """One worker connection: its socket, its framing and its two slabs."""

    def __init__(self, sock: socket.socket):
        self.sock = sock
        self.framer = channel.Framer(sock)
        self.pid = 0
        self.slabs: dict[str, channel.Slab] = {}
        self.gone = False

    def close(self) -> None:
        for slab in self.slabs.values():
            slab.close()
        self.slabs = {}
        with contextlib.suppress(OSError):
            self.sock.close()


class Loop:
    def __init__(self, host: Any, listener: socket.socket):
        """``host``: the :class:`~servekit.hosts.host.Host` whose version this loop serves."""
        self.host = host
        self.listener = listener
        self.selector = selectors.DefaultSelector()
        #: connections whose answer a thread of their own has sent, back to the loop
        self.back: queue.SimpleQueue[Peer] = queue.SimpleQueue()
        self.wake_in, self.wake_out = socket.socketpair()

    def run(self) -> None:
        self.wake_in.setblocking(False)
        self.selector.register(self.wake_in, selectors.EVENT_READ, self)
        threading.Thread(target=self._accept, name="servekit-host-accept", daemon=True).start()
        while True:
            waiting: list[tuple[Peer, dict[str, Any]]] = []
            for key, _ in self.selector.select():
                if key.data is self:
                    self._welcome_back()
                else:
                    self._read(key.data, waiting)
            if waiting:
                self._predict(waiting)

    # -- connections ---------------------------------------------------------------

    def _accept(self) -> None:
        """Accept and greet new connections beside the loop, then hand them to it.

        A worker's new connection must not wait for its greeting until the
        loop's current call ends: its request would then miss the batch that
        forms meanwhile (and a long call would time out the greeting).
        """
        while True:
            try:
                sock, _ = self.listener.accept()
            except OSError as exc:  # out of file descriptors, say: the worker retries
                log.warning("model host: cannot accept a connection: %s", exc)
                time.sleep(0.05)
                continue
            peer = Peer(sock)
            try:
                sock.settimeout(GREETING_SECONDS)
                hello = peer.framer.read()
                if Op.of(hello) is not Op.HELLO:
                    raise channel.PeerGone("the first message was not a greeting")
                peer.pid, peer.slabs = self.host.greet(sock, hello)
                sock.settimeout(None)  # answers are sent whole; reads never wait (MSG_DONTWAIT)
            except (channel.PeerGone, OSError, EOFError):
                peer.close()
                continue
            self._hand_back(peer)

    def _read(self, peer: Peer, waiting: list[tuple[Peer, dict[str, Any]]]) -> None:
        try:
            for message in peer.framer.ready():
                op = Op.of(message)
                if op is Op.PREDICT:
                    self.host.take_slab(message, peer.slabs)
                    waiting.append((peer, message))
                elif op is Op.DETACH:
                    self.host.detach(peer.pid)
                    channel.send(peer.sock, {"ok": True})
                else:
                    self._apart(peer, functools.partial(self.host.answer, peer.sock, message, peer.slabs))
        except (channel.PeerGone, OSError, EOFError):
            self._drop(peer)

    def _drop(self, peer: Peer) -> None:
        with contextlib.suppress(KeyError, ValueError):
            self.selector.unregister(peer.sock)
        peer.close()

    def _apart(self, peer: Peer, work: Callable[[], None]) -> None:
        """Answer on a thread of its own (a slow or streaming answer must not hold the loop)."""
        self.selector.unregister(peer.sock)
        threading.Thread(target=self._answer_apart, args=(peer, work), daemon=True).start()

    def _answer_apart(self, peer: Peer, work: Callable[[], None]) -> None:
        try:
            work()
        except (channel.PeerGone, OSError):
            peer.gone = True
        finally:
            self._hand_back(peer)

    def _hand_back(self, peer: Peer) -> None:
        """From another thread: the loop (re)takes this connection."""
        self.back.put(peer)
        with contextlib.suppress(OSError):
            self.wake_out.send(b"\0")

    def _welcome_back(self) -> None:
        with contextlib.suppress(BlockingIOError):
            self.wake_in.recv(4096)
        while True:
            try:
                peer = self.back.get_nowait()
            except queue.Empty:
                return
            if peer.gone:
                peer.close()
            else:
                self.selector.register(peer.sock, selectors.EVENT_READ, peer)

    # -- the batch -------------------------------------------------------------------

    def _predict(self, waiting: list[tuple[Peer, dict[str, Any]]]) -> None:
        host = self.host
        peers: list[Peer] = []
        calls: list[tuple[Any, dict[str, Any]]] = []
        for peer, message in waiting:
            try:
                args, kwargs = arguments(message, peer.slabs["in"])
                calls.append((args[0], kwargs))
                peers.append(peer)
            except Exception as exc:
                self._send(peer, {"error": error_of(exc)})
        spans = self._spans([message for _, message in waiting]) if tracing.ON else []
        host.busy(len(calls))
        try:
            if spans:  # the shared call shows under the first request's trace
                spans[0].enter()
            outcomes = host.executor.predict_together(host.mv, calls)
        except BaseException as exc:  # a fault of the loop itself: every waiting request hears of it
            outcomes = [(None, exc)] * len(calls)
        finally:
            if spans:
                spans[0].leave()
            host.busy(-len(calls))
        for span in spans:
            span.end(attributes={tracing.BATCH_SIZE: len(calls)})
        for peer, (result, error) in zip(peers, outcomes):
            if error is not None:
                self._send(peer, {"error": error_of(error)})
            elif is_stream(result):
                self._apart(peer, functools.partial(host.reply, peer.sock, result, peer.slabs))
            else:
                try:
                    host.reply(peer.sock, result, peer.slabs)
                except (channel.PeerGone, OSError):
                    self._drop(peer)

    def _spans(self, messages: list[dict[str, Any]]) -> list[tracing.ServerSpan]:
        """One host span per traced request of a shared call, each in its caller's trace."""
        attributes = self.host.span_attributes()
        return [tracing.ServerSpan("servekit.host.serve", m["trace"], attributes) for m in messages if m.get("trace")]

    def _send(self, peer: Peer, header: dict[str, Any]) -> None:
        try:
            channel.send(peer.sock, header)
        except OSError:
            self._drop(peer)
