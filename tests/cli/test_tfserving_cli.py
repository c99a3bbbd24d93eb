"""``tensorflow_model_server``'s command line: its flags and TF Serving's text-format config files.

The binary itself, started and checked as TF Serving's own test suite does, is
``test_tfserving_binary.py``'s.
"""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest
from repo_paths import TF_DATA
from servekit.cli import tfserving as tfserving_cli
from servekit.cli import tfserving_files as tfserving_config
from servekit.cli.tfserving import FlagError
from servekit.server.settings import channel_arguments

HALF_PLUS_TWO = TF_DATA / "saved_model_half_plus_two_cpu"
TWO_VERSIONS = TF_DATA / "saved_model_half_plus_two_2_versions"
HALF_PLUS_THREE = TF_DATA / "saved_model_half_plus_three"


# -- flags and config files (no server) -------------------------------------------------------


def test_flags_parse_as_tensorflows_parser_does():
    flags = tfserving_cli.parse_flags(
        [
            "--port=8500",
            "--rest_api_port",
            "8501",
            "--enable_batching",
            "--model_name=m",
            "--enable_serialization_as_tensor_content=true",
            "--rest_api_timeout_in_ms=5000",
        ]
    )
    assert flags == {
        "port": 8500,
        "rest_api_port": 8501,
        "enable_batching": True,
        "model_name": "m",
        "enable_serialization_as_tensor_content": True,
        "rest_api_timeout_in_ms": 5000,
    }


@pytest.mark.parametrize(
    ("argv", "fragment"),
    [
        (["--no_such_flag=1"], "unknown flag --no_such_flag"),
        (["--port=eighty"], "--port: expected int"),
        (["--enable_batching=maybe"], "--enable_batching: expected true or false"),
        (["--xla_cpu_compilation_enabled=true"], "--xla_cpu_compilation_enabled=true is not supported"),
        (["--tensorflow_intra_op_parallelism=4"], "--tensorflow_intra_op_parallelism=4 is not supported"),
        (["models/"], "unexpected argument"),
    ],
)
def test_flags_servekit_cannot_honour_are_refused_by_name(argv, fragment):
    with pytest.raises(FlagError) as info:
        tfserving_cli.parse_flags(argv)
    assert fragment in str(info.value)


def test_a_flag_at_tf_servings_default_is_accepted():
    assert tfserving_cli.parse_flags(["--use_tflite_model=false", "--enable_model_warmup=true"]) == {
        "use_tflite_model": False,
        "enable_model_warmup": True,
    }


def test_flags_map_to_settings(tmp_path):
    batching = tmp_path / "batching.txt"
    batching.write_text(
        "max_batch_size { value: 128 }\nbatch_timeout_micros { value: 2500 }\n"
        "max_enqueued_batches { value: 1000000 }\nnum_batch_threads { value: 8 }\n"
    )
    flags = tfserving_cli.parse_flags(
        [
            "--port=9000",
            "--rest_api_port=9001",
            "--rest_api_timeout_in_ms=5000",
            f"--model_base_path={HALF_PLUS_TWO}",
            "--enable_batching",
            f"--batching_parameters_file={batching}",
            "--enable_serialization_as_tensor_content",
            "--grpc_channel_arguments=grpc.max_connection_age_ms=2000",
            "--file_system_poll_wait_seconds=3",
            "--grpc_socket_path=/tmp/x.sock",
        ]
    )
    settings, mirror = tfserving_cli.build(flags)
    assert mirror is None
    assert (settings.grpc_port, settings.http_port, settings.request_timeout) == (9000, 9001, 5.0)
    assert settings.paths == [str(HALF_PLUS_TWO)] and settings.model_name == "default"
    assert (settings.max_batch_size, settings.max_batch_time_ms) == (128, 2.5)
    assert settings.grpc_tensor_content and settings.poll_interval == 3.0
    assert channel_arguments(settings.grpc_channel_arguments) == [("grpc.max_connection_age_ms", 2000)]
    assert settings.grpc_socket_path == "/tmp/x.sock"


@pytest.mark.parametrize(
    ("text", "fragment"),
    [
        ("model_config_list { config { name: 'a' base_path: '/x' model_platform: 'pytorch' } }", "model_platform"),
        ("model_config_list { config { name: 'a' base_path: '/x' logging_config {} } }", "logging_config"),
        (
            "model_config_list { config { name: 'a' base_path: '/x' } config { name: 'a' base_path: '/y' } }",
            "configured twice",
        ),
        ("model_config_list { config { nme: 'a' } }", "Error parsing text-format tensorflow.serving.ModelServerConfig"),
    ],
)
def test_model_config_file_errors_name_the_field(tmp_path, text, fragment):
    path = tmp_path / "models.config"
    path.write_text(text)
    with pytest.raises(FlagError) as info:
        tfserving_config.read_model_config_file(str(path))
    assert fragment in str(info.value)


def test_bad_model_config_exits_with_tf_servings_message(tmp_path, capsys):
    """TF Serving's testBadModelConfig: the parse error on stderr, an exit status, no traceback."""
    from servekit.cli.tfserving import main

    path = tmp_path / "bad_model_config.txt"
    path.write_text("improperly formatted file")
    assert main(["--port=8500", f"--model_config_file={path}"]) != 0
    err = capsys.readouterr().err
    assert "Error parsing text-format tensorflow.serving.ModelServerConfig" in err and "Traceback" not in err


def test_model_config_file_becomes_servekit_yaml(tmp_path):
    base = tmp_path / "base"
    shutil.copytree(TWO_VERSIONS, base)
    path = tmp_path / "models.config"
    path.write_text(f"""
model_config_list {{
  config {{
    name: "hp2"
    base_path: "{base}"
    model_platform: "tensorflow"
    model_version_policy {{ specific {{ versions: 123 versions: 124 }} }}
    version_labels {{ key: "stable" value: 123 }}
    version_labels {{ key: "canary" value: 124 }}
  }}
}}""")
    mirror = tfserving_config.ConfigFileFolders(str(path))
    try:
        folder = Path(mirror.paths[0])
        assert folder.name == "hp2"
        assert sorted(p.name for p in folder.iterdir()) == ["00000123", "00000124", "servekit.yaml"]
        import yaml

        config = yaml.safe_load((folder / "servekit.yaml").read_text())
        assert config == {"version_policy": {"specific": [123, 124]}, "labels": {"stable": 123, "canary": 124}}
        shutil.rmtree(base / "00000123")  # a version removed on disk goes from the mirror too
        mirror.sync()
        assert sorted(p.name for p in folder.iterdir()) == ["00000124", "servekit.yaml"]
    finally:
        mirror.close()


def test_monitoring_path_other_than_tf_servings_is_refused(tmp_path):
    path = tmp_path / "monitoring.config"
    path.write_text('prometheus_config { enable: true, path: "/elsewhere" }')
    with pytest.raises(FlagError) as info:
        tfserving_config.check_monitoring_file(str(path))
    assert "/elsewhere" in str(info.value)


def test_unsupported_batching_fields_are_refused(tmp_path):
    path = tmp_path / "batching.txt"
    path.write_text("max_batch_size { value: 8 }\nallowed_batch_sizes: 8\n")
    with pytest.raises(FlagError) as info:
        tfserving_config.read_batching_file(str(path))
    assert "allowed_batch_sizes" in str(info.value)


def test_the_entry_point_exits_2_naming_the_flag(capsys):
    assert tfserving_cli.main(["--model_base_path=/x", "--platform_config_file=p.txt"]) == 2
    assert "--platform_config_file" in capsys.readouterr().err
    assert tfserving_cli.main(["--port=1"]) == 2
    assert "--model_config_file or --model_base_path" in capsys.readouterr().err


def test_servekit_tfserving_subcommand_takes_the_same_flags(capsys):
    from servekit.cli import commands as cli

    assert cli.main(["tfserving", "--version"]) == 0
    assert "TensorFlow ModelServer" in capsys.readouterr().out
    assert cli.main(["tfserving", "--bogus_flag=1"]) == 2
    assert "unknown flag --bogus_flag" in capsys.readouterr().err


def test_workers_starting_together_all_bind_the_grpc_socket_path(tmp_path):
    """--grpc_socket_path: every worker binds it (the last one answers), however their starts interleave."""
    import threading
    from concurrent import futures

    import grpc
    from servekit.server.grpc_server import _bind_unix_socket

    def worker(path: str, start: threading.Barrier, servers: list, failures: list) -> None:
        server = grpc.server(futures.ThreadPoolExecutor(1))
        servers.append(server)
        start.wait()
        try:
            _bind_unix_socket(server, path)
        except Exception as exc:
            failures.append(exc)

    for round_ in range(10):  # without a lock, about half the rounds saw "address already in use"
        path = str(tmp_path / f"tf-serving-{round_}.sock")
        start = threading.Barrier(8)
        servers: list = []
        failures: list[Exception] = []
        threads = [threading.Thread(target=worker, args=(path, start, servers, failures)) for _ in range(8)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(30)
        assert not failures, failures
    not_a_socket = tmp_path / "taken.txt"
    not_a_socket.write_text("keep me")
    with pytest.raises(RuntimeError, match="cannot bind gRPC to the Unix socket"):
        _bind_unix_socket(grpc.server(futures.ThreadPoolExecutor(1)), str(not_a_socket))
    assert not_a_socket.read_text() == "keep me"  # a file that is not a socket is never removed
