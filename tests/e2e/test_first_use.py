"""What a new user trips on first (issue 29): the start-up lines and the first errors read right.

The banner names only plugins that can load a model (the others apart, with
what installs them); gunicorn's ``Listening at:`` names the address; a value
of the wrong type names the flag, variable or config key it came from, in
English; a malformed request gunicorn refuses itself is a JSON error.
"""

from __future__ import annotations

import argparse
import socket

import pytest
from servekit.hooks import manager as plugins
from servekit.server import ports
from servekit.server import settings as settings_mod
from servekit.testing import ServerProcess

NEEDS_A_MISSING_LIBRARY = """
import servekit

SERVEKIT_REQUIRES = ("servekit_no_such_library",)


@servekit.hookimpl
def load(path):
    return None
"""


def test_banner_lists_apart_a_plugin_whose_library_is_missing(tmp_path):
    plugin = tmp_path / "needs_lib.py"
    plugin.write_text(NEEDS_A_MISSING_LIBRARY)
    infos = plugins.describe(plugins.build_manager([str(plugin)]))
    names, not_installed = plugins.usable(infos)
    assert "needs_lib" not in names and "sklearn" in names  # scikit-learn is installed for the suite
    assert not_installed["needs_lib"] == "needs servekit_no_such_library"
    # any other entry is a first-party plugin whose library this Python lacks (torch on the other Pythons)
    others = {name: hint for name, hint in not_installed.items() if name != "needs_lib"}
    assert all(hint.startswith("pip install 'servekit[") for hint in others.values()), others
    first = ports.startup_lines(settings_mod.Settings(), ["iris"], names, {"needs_lib": not_installed["needs_lib"]})[0]
    assert first.endswith("; needs_lib not installed (needs servekit_no_such_library)")
    assert "plugins: " + ", ".join(names) + ";" in first


def test_a_framework_plugin_without_its_library_names_the_extra():
    info = plugins.PluginInfo("torch", ["load"], "servekit", missing=["torch"])
    assert plugins.usable([info]) == ([], {"torch": "pip install 'servekit[torch]'"})


def test_every_first_party_plugin_declares_its_library():
    infos = {i.name: i for i in plugins.describe(plugins.build_manager())}
    for name in ("sklearn", "torch", "tensorflow", "huggingface", "xgboost", "lightgbm", "onnx"):
        if name in infos:
            plugin = plugins.import_plugin(f"servekit_{name}")
            assert plugin.SERVEKIT_REQUIRES, name
            assert all(m in plugins.EXTRAS for m in plugin.SERVEKIT_REQUIRES), name


def _resolve(argv, environ=None):
    parser = argparse.ArgumentParser()
    settings_mod.add_arguments(parser)
    return settings_mod.resolve(parser.parse_args(argv), environ or {})


@pytest.mark.parametrize(
    "argv, environ, config, message",
    [
        (["m", "--http-port", "abc"], {}, None, "--http-port: expected an integer, found 'abc'"),
        (["m"], {"SERVEKIT_HTTP_PORT": "x"}, None, "SERVEKIT_HTTP_PORT: expected an integer, found 'x'"),
        (["m"], {}, "http_port: eighty\n", "servekit.yaml: http_port: expected an integer, found 'eighty'"),
        (["m", "--request-timeout", "soon"], {}, None, "--request-timeout: expected a number, found 'soon'"),
    ],
)
def test_a_value_of_the_wrong_type_names_where_it_came_from(tmp_path, argv, environ, config, message):
    if config is not None:
        (tmp_path / "servekit.yaml").write_text(config)
        argv = [*argv, "--config", str(tmp_path / "servekit.yaml")]
    with pytest.raises(ValueError) as caught:
        _resolve(argv, environ)
    assert str(caught.value).endswith(message)
    assert "a int" not in str(caught.value) and "setting " not in str(caught.value)


ECHO = """
import servekit

@servekit.hookimpl
def load(path):
    return "echo"

@servekit.hookimpl
def predict(inputs):
    return inputs
"""


def _raw(port: int, head: str) -> bytes:
    with socket.create_connection(("127.0.0.1", port), timeout=10) as sock:
        sock.sendall(head.encode() + b"{}")
        answer = b""
        while piece := sock.recv(65536):
            answer += piece
    return answer


@pytest.mark.slow
@pytest.mark.parametrize("engine", ["gunicorn", "granian"])
def test_a_negative_content_length_is_a_400_never_an_html_page(tmp_path, engine):
    if engine == "granian":
        pytest.importorskip("granian")
    (tmp_path / "echo" / "1").mkdir(parents=True)
    (tmp_path / "echo" / "1" / "model.py").write_text(ECHO)
    server = ServerProcess(tmp_path, server=engine).start()
    try:
        for length in ("-5", "abc"):
            head = f"POST /v2/models/echo/infer HTTP/1.1\r\nHost: x\r\nContent-Length: {length}\r\n\r\n"
            status, _, rest = _raw(server.http_port, head).partition(b"\r\n")
            headers, _, body = rest.partition(b"\r\n\r\n")
            assert status.startswith(b"HTTP/1.1 400"), (length, status)
            assert b"<html" not in body.lower()
            if engine == "gunicorn":  # granian (hyper) answers an empty 400 before any app code runs
                assert b"content-type: application/json" in headers.lower()
                assert body == b'{"error":"Invalid HTTP Header: \'CONTENT-LENGTH\'"}'
            else:
                assert body == b""
    finally:
        server.stop()
    if engine == "gunicorn":
        assert f"Listening at: http://127.0.0.1:{server.http_port} (" in server.output()
