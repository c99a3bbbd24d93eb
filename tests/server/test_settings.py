"""Flags, their SERVEKIT_* twins, --config files and TF Serving's environment variables."""

from __future__ import annotations

import argparse

import pytest
from servekit.server import settings as s


def parse(argv, environ=None):
    parser = argparse.ArgumentParser()
    s.add_arguments(parser)
    return s.resolve(parser.parse_args(argv), environ or {})


def test_defaults():
    got = parse(["models"])
    assert (got.paths, got.http_port, got.grpc_port, got.workers) == (["models"], 8080, 8081, "auto")
    assert (got.server, got.strict_readiness, got.model_control_mode, got.preload, got.fast_lane) == (
        "gunicorn",
        True,
        "none",
        None,
        True,
    )


@pytest.mark.parametrize(
    ("argv", "flag"),
    [
        (["--log-level", "verbose"], "--log-level"),
        (["--http-port", "99999"], "--http-port"),
        (["--grpc-port", "-1"], "--grpc-port"),
        (["--grpc-threads", "-1"], "--grpc-threads"),
        (["--workers", "0"], "--workers"),
        (["--workers", "many"], "--workers"),
        (["--ports-after-load", "--server", "granian"], "--ports-after-load"),  # granian binds before its load
    ],
)
def test_values_no_server_could_start_with_name_the_flag(argv, flag):
    with pytest.raises(ValueError, match=flag):
        parse(["models", *argv])


def test_negative_flags_and_choices():
    got = parse(["models", "--no-strict-readiness", "--no-preload", "--server", "granian"])
    assert (got.strict_readiness, got.preload, got.server) == (False, False, "granian")
    with pytest.raises(ValueError, match="expected one of explicit, none|expected one of none, explicit"):
        parse([], {"SERVEKIT_MODEL_CONTROL_MODE": "sometimes", "SERVEKIT_PATHS": "m"})


def test_every_flag_has_an_environment_twin_and_flags_win(tmp_path):
    env = {
        "SERVEKIT_HTTP_PORT": "9000",
        "SERVEKIT_WORKERS": "3",
        "SERVEKIT_API_KEY": "k",
        "SERVEKIT_PLUGIN": "a.py,b.py",
        "SERVEKIT_PRELOAD": "true",
        "SERVEKIT_PATHS": "m1,m2",
    }
    got = parse([], env)
    assert (got.http_port, got.workers, got.api_key, got.plugin, got.preload, got.paths) == (
        9000,
        "3",
        "k",
        ["a.py", "b.py"],
        True,
        ["m1", "m2"],
    )
    assert parse(["--http-port", "9100"], env).http_port == 9100


def test_config_file_is_lowest_precedence(tmp_path):
    config = tmp_path / "servekit.yaml"
    config.write_text("http_port: 7000\nthreads: 4\nmax-request-size: 1024\n")
    got = parse(["--config", str(config), "--threads", "2"], {"SERVEKIT_HTTP_PORT": "7100"})
    assert (got.http_port, got.threads, got.max_request_size) == (7100, 2, 1024)
    config.write_text("colour: blue\n")
    with pytest.raises(ValueError, match="unknown setting"):
        parse(["--config", str(config)])


def test_tf_serving_model_name_and_base_path(tmp_path):
    got = parse([], {"MODEL_BASE_PATH": "/models", "MODEL_NAME": "half"})
    assert (got.paths, got.model_name) == (["/models/half"], "half")


def test_wrong_types_are_reported():
    with pytest.raises(ValueError, match="--http-port: expected an integer, found 'eighty'"):
        parse(["--http-port", "eighty"])
