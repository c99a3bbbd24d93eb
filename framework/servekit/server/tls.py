"""TLS for HTTP and gRPC: ``--tls-cert``, ``--tls-key``, ``--tls-client-ca`` (mutual TLS).

The certificate and key are PEM files; ``--tls-client-ca`` makes the server
require a client certificate signed by that CA (mutual TLS) and refuse the
handshake of any client without one.  Each engine's own TLS does the work:

- gunicorn: its ``ssl_context`` hook hands out one :class:`ssl.SSLContext`
  per worker, built again when the files change (:class:`ReloadingContext`);
- granian: its ``ssl_cert``/``ssl_key``/``ssl_ca``/``ssl_client_verify``; its
  workers read the files when they start, so a change of the files respawns them
  one by one (:func:`watch_files`);
- gRPC: ``grpc.dynamic_ssl_server_credentials``, whose fetcher hands gRPC the
  new certificate when the files change (asked at each new connection).

Certificates rotate without a restart: files are compared by modification time
and size, checked at most once a second.  ``servekit tfserving
--ssl_config_file`` reads TF Serving's text-format ``SSLConfig``
(:func:`read_tf_ssl_config`), which carries the PEM texts themselves.
"""

from __future__ import annotations

import logging
import os
import ssl
import tempfile
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

log = logging.getLogger("servekit.tls")

_RECHECK_SECONDS = 1.0


@dataclass(frozen=True)
class TlsFiles:
    cert: str
    key: str
    client_ca: str = ""

    @property
    def paths(self) -> list[str]:
        return [p for p in (self.cert, self.key, self.client_ca) if p]

    def stamp(self) -> tuple:
        """What changes when any file does: (mtime, size) of each."""
        out: list[tuple[int, int] | None] = []
        for path in self.paths:
            try:
                st = os.stat(path)
                out.append((st.st_mtime_ns, st.st_size))
            except OSError:
                out.append(None)
        return tuple(out)


def files_of(settings: Any, wire: str) -> TlsFiles | None:
    """The TLS files for ``wire`` ('http' or 'grpc'), or ``None`` for plain text.

    :raises ValueError: a cert without a key (or the other way round), a client CA
        without a cert, or a file that cannot be read.
    """
    cert, key, ca = (getattr(settings, name, "") or "" for name in ("tls_cert", "tls_key", "tls_client_ca"))
    if not (cert or key or ca):
        return None
    if not (cert and key):
        raise ValueError("--tls-cert and --tls-key go together (and --tls-client-ca needs both)")
    for flag, path in (("--tls-cert", cert), ("--tls-key", key), ("--tls-client-ca", ca)):
        if path and not os.access(path, os.R_OK):
            raise ValueError(f"{flag}: cannot read {path}")
    if wire == "http" and getattr(settings, "tls_scope", "all") == "grpc":
        return None
    return TlsFiles(cert, key, ca)


def server_context(files: TlsFiles) -> ssl.SSLContext:
    """An HTTP server context: TLS 1.2 or later, the cert chain, and client verification with a CA."""
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    context.minimum_version = ssl.TLSVersion.TLSv1_2
    context.load_cert_chain(files.cert, files.key)
    if files.client_ca:
        context.load_verify_locations(cafile=files.client_ca)
        context.verify_mode = ssl.CERT_REQUIRED
    return context


class ReloadingContext:
    """A server :class:`ssl.SSLContext` built again when its files change.

    A half-written file (a rotation in progress) fails to load: the previous
    context keeps serving and the next check tries again.
    """

    def __init__(self, files: TlsFiles, build: Callable[[TlsFiles], ssl.SSLContext] = server_context):
        self.files = files
        self._build = build
        self._stamp = files.stamp()
        self._context = build(files)
        self._checked = time.monotonic()
        self._lock = threading.Lock()

    def context(self) -> ssl.SSLContext:
        if time.monotonic() - self._checked >= _RECHECK_SECONDS:
            with self._lock:
                self._checked = time.monotonic()
                stamp = self.files.stamp()
                if stamp != self._stamp:
                    try:
                        self._context = self._build(self.files)
                        self._stamp = stamp
                        log.info("TLS certificate reloaded from %s", self.files.cert)
                    except (OSError, ssl.SSLError, ValueError) as exc:
                        log.error("TLS certificate not reloaded, the previous one stays: %s", exc)
        return self._context


# -- the engines -----------------------------------------------------------------------------


def gunicorn_options(files: TlsFiles) -> dict[str, Any]:
    """gunicorn settings for TLS: the files (so gunicorn knows it is TLS) and the reloading context."""
    holder: dict[str, ReloadingContext] = {}

    def ssl_context(conf: Any, default_factory: Callable[[], ssl.SSLContext]) -> ssl.SSLContext:
        # built on first use in each worker (after the fork), then shared by its connections
        if "ctx" not in holder:
            holder["ctx"] = ReloadingContext(files)
        return holder["ctx"].context()

    options: dict[str, Any] = {"certfile": files.cert, "keyfile": files.key, "ssl_context": ssl_context}
    if files.client_ca:
        options.update(ca_certs=files.client_ca, cert_reqs=ssl.CERT_REQUIRED)
    return options


def granian_options(files: TlsFiles) -> dict[str, Any]:
    """granian's own TLS arguments."""
    options: dict[str, Any] = {"ssl_cert": Path(files.cert), "ssl_key": Path(files.key)}
    if files.client_ca:
        options.update(ssl_ca=Path(files.client_ca), ssl_client_verify=True)
    return options


def watch_files(files: TlsFiles, on_change: Callable[[], None], interval: float = _RECHECK_SECONDS) -> None:
    """Call ``on_change`` (in a daemon thread) whenever the files change."""

    def loop() -> None:
        stamp = files.stamp()
        while True:
            time.sleep(interval)
            now = files.stamp()
            if now != stamp and None not in now:
                stamp = now
                log.info("TLS files changed: reloading")
                on_change()

    threading.Thread(target=loop, name="servekit-tls-watch", daemon=True).start()


def grpc_credentials(files: TlsFiles) -> Any:
    """gRPC server credentials that follow the files (mutual TLS with a client CA)."""
    import grpc

    def configuration() -> Any:
        pair = (Path(files.key).read_bytes(), Path(files.cert).read_bytes())
        roots = Path(files.client_ca).read_bytes() if files.client_ca else None
        return grpc.ssl_server_certificate_configuration([pair], root_certificates=roots)

    state = {"stamp": files.stamp()}

    def fetch() -> Any:
        stamp = files.stamp()
        if stamp == state["stamp"] or None in stamp:
            return None  # unchanged: gRPC keeps the one it has
        try:
            config = configuration()
        except OSError as exc:
            log.error("gRPC TLS certificate not reloaded: %s", exc)
            return None
        state["stamp"] = stamp
        log.info("gRPC TLS certificate reloaded from %s", files.cert)
        return config

    return grpc.dynamic_ssl_server_credentials(
        configuration(), fetch, require_client_authentication=bool(files.client_ca)
    )


# -- TF Serving's --ssl_config_file --------------------------------------------------------------


def read_tf_ssl_config(path: str) -> dict[str, Any]:
    """TF Serving's text-format ``SSLConfig`` as servekit settings (gRPC only, as in TF Serving).

    The config holds the PEM texts; they are written to files in a private
    temporary folder (mode 0600) that lives as long as the process.
    """
    from google.protobuf import text_format

    message = _ssl_config_class()()
    try:
        text_format.Parse(Path(path).read_text(), message)
    except (OSError, text_format.ParseError) as exc:
        raise ValueError(f"--ssl_config_file: {exc}") from None
    if not (message.server_key and message.server_cert):
        raise ValueError("--ssl_config_file: server_key and server_cert are both required")
    if message.client_verify and not message.custom_ca:
        raise ValueError("--ssl_config_file: client_verify needs custom_ca")
    folder = tempfile.mkdtemp(prefix="servekit-tls-")
    values: dict[str, Any] = {"tls_scope": "grpc"}
    texts = {"tls_key": message.server_key, "tls_cert": message.server_cert}
    if message.client_verify:
        texts["tls_client_ca"] = message.custom_ca
    for name, text in texts.items():
        target = os.path.join(folder, name + ".pem")
        fd = os.open(target, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        with os.fdopen(fd, "w") as out:
            out.write(text)
        values[name] = target
    return values


def _ssl_config_class() -> type:
    """``tensorflow.serving.SSLConfig`` (model_server's ssl_config.proto), built from its descriptor."""
    from google.protobuf import descriptor_pb2, descriptor_pool, message_factory

    name = "tensorflow.serving.SSLConfig"
    if name in _CLASSES:
        return _CLASSES[name]
    pool = descriptor_pool.DescriptorPool()  # its own pool: tensorflow-serving-api may register the same name
    proto = descriptor_pb2.FileDescriptorProto(
        name="servekit/tensorflow_serving/ssl_config.proto", package="tensorflow.serving", syntax="proto3"
    )
    msg = proto.message_type.add(name="SSLConfig")
    string, boolean = descriptor_pb2.FieldDescriptorProto.TYPE_STRING, descriptor_pb2.FieldDescriptorProto.TYPE_BOOL
    optional = descriptor_pb2.FieldDescriptorProto.LABEL_OPTIONAL
    for number, (field, kind) in enumerate(
        (("server_key", string), ("server_cert", string), ("custom_ca", string), ("client_verify", boolean)), 1
    ):
        msg.field.add(name=field, number=number, type=kind, label=optional)
    pool.Add(proto)
    _CLASSES[name] = message_factory.GetMessageClass(pool.FindMessageTypeByName(name))
    return _CLASSES[name]


_CLASSES: dict[str, type] = {}
