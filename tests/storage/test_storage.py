"""Model paths in object storage (servekit.storage), against real servers on loopback.

S3 through moto's standalone server (authentication on), gs:// through
gcp-storage-emulator, http(s) archives through ``http.server``; servekit reads
them with the real client libraries (s3fs, gcsfs, aiohttp).
"""

from __future__ import annotations

import io
import os
import subprocess
import sys
import tarfile
import time
import zipfile
from pathlib import Path

import numpy as np
import pytest
import requests
from servekit import storage
from servekit.control.plan import Planner
from servekit.storage import filesystems, uris
from servekit.testing import ServerProcess
from storage_servers import ArchiveServer, GCSServer, S3Server


@pytest.fixture(scope="module")
def s3(tmp_path_factory):
    server = S3Server(tmp_path_factory.mktemp("moto"))
    yield server
    server.stop()


@pytest.fixture
def s3_env(s3, monkeypatch, tmp_path):
    for key, value in s3.env().items():
        monkeypatch.setenv(key, value)
    monkeypatch.setenv(storage.CACHE_ENV, str(tmp_path / "cache"))
    return s3


@pytest.fixture(scope="module")
def archives(tmp_path_factory):
    server = ArchiveServer(tmp_path_factory.mktemp("archives"))
    yield server
    server.stop()


def put(s3, bucket: str, files: dict[str, bytes]) -> None:
    if bucket not in [b["Name"] for b in s3.client.list_buckets()["Buckets"]]:
        s3.client.create_bucket(Bucket=bucket)
    for key, data in files.items():
        s3.client.put_object(Bucket=bucket, Key=key, Body=data)


def tree(folder: Path) -> list[str]:
    return sorted(p.relative_to(folder).as_posix() for p in folder.rglob("*") if not p.name.startswith("."))


# -- URIs and settings ----------------------------------------------------------------------------


def test_uris_are_told_from_local_paths():
    assert uris.is_uri("s3://bucket/models") and uris.is_uri("gs://b/p") and uris.is_uri("https://h/m.tar.gz")
    assert not uris.is_uri("/models/iris") and not uris.is_uri("models") and not uris.is_uri("file:///x")
    assert uris.basename("s3://bucket/models/iris/") == "iris"
    assert uris.basename("s3://bucket") == "bucket"
    assert uris.basename("https://host/path/iris.tar.gz?sig=1") == "iris"
    assert uris.normalized("s3://b/models/") == "s3://b/models"
    with pytest.raises(ValueError, match="archive"):
        uris.check("https://host/model.bin")
    with pytest.raises(ValueError, match="no bucket"):
        uris.check("s3:///prefix")


def test_local_path_is_one_cache_folder_per_uri_named_as_its_last_part(monkeypatch, tmp_path):
    monkeypatch.setenv(storage.CACHE_ENV, str(tmp_path))
    a, b = storage.local_path("s3://b/one/iris"), storage.local_path("s3://b/two/iris")
    assert a.name == b.name == "iris" and a != b and a.parent.parent == tmp_path
    assert storage.local_path("s3://b/one/iris/") == a


def test_s3_options_read_tf_servings_and_the_sdks_variables():
    assert filesystems.s3_options({}) == {}
    tf = filesystems.s3_options({"S3_ENDPOINT": "minio:9000", "S3_USE_HTTPS": "0", "S3_VERIFY_SSL": "0"})
    assert tf == {"endpoint_url": "http://minio:9000", "client_kwargs": {"verify": False}}
    assert filesystems.s3_options({"S3_ENDPOINT": "minio:9000"})["endpoint_url"] == "https://minio:9000"
    sdk = filesystems.s3_options({"AWS_ENDPOINT_URL": "http://x:1", "S3_ENDPOINT": "y:2", "AWS_REGION": "eu-west-1"})
    assert sdk == {"endpoint_url": "http://x:1", "client_kwargs": {"region_name": "eu-west-1"}}
    assert filesystems.s3_options({"AWS_ANON": "true"}) == {"anon": True}


def test_settings_take_uris_through_model_base_path_and_storage_uri(tmp_path):
    from servekit.server.settings import resolve

    settings = resolve(environ={"MODEL_BASE_PATH": "s3://bucket/models/", "MODEL_NAME": "iris"})
    assert settings.paths == ["s3://bucket/models/iris"] and settings.model_name == "iris"
    assert settings.model_paths == [storage.local_path("s3://bucket/models/iris")]
    assert resolve(environ={"STORAGE_URI": "gs://b/m"}).paths == ["gs://b/m"]


# -- S3 ---------------------------------------------------------------------------------------


def test_a_repository_is_mirrored_by_each_models_version_policy(s3_env):
    put(
        s3_env,
        "repo",
        {
            "models/iris/1/model.joblib": b"one",
            "models/iris/2/model.joblib": b"two",
            "models/iris/servekit.yaml": b"version_policy: all\n",
            "models/wine/1/model.joblib": b"w1",
            "models/wine/2/model.joblib": b"w2",
            "models/README.md": b"not a model",
        },
    )
    folder = storage.prepare("s3://repo/models")
    assert folder.name == "models"
    assert tree(folder) == [
        "iris",
        "iris/1",
        "iris/1/model.joblib",
        "iris/2",
        "iris/2/model.joblib",
        "iris/servekit.yaml",
        "wine",
        "wine/2",
        "wine/2/model.joblib",  # latest only: version 1 is not downloaded
    ]
    assert (folder / "iris" / "2" / "model.joblib").read_bytes() == b"two"
    assert storage.source_of(folder / "iris")[1]["uri"] == "s3://repo/models/iris"


def test_an_unchanged_version_is_not_downloaded_again(s3_env):
    put(s3_env, "again", {"m/1/model.joblib": b"one"})
    first = storage.prepare("s3://again/m") / "1" / "model.joblib"
    stamp = first.stat().st_mtime_ns
    assert (storage.prepare("s3://again/m") / "1" / "model.joblib").stat().st_mtime_ns == stamp
    put(s3_env, "again", {"m/1/model.joblib": b"changed"})
    assert (storage.prepare("s3://again/m") / "1" / "model.joblib").read_bytes() == b"changed"


def test_a_folder_without_versions_is_version_one(s3_env):
    put(s3_env, "flat", {"iris/model.joblib": b"x", "iris/servekit.yaml": b"labels: {}\n"})
    folder = storage.prepare("s3://flat/iris")
    assert tree(folder) == ["model.joblib", "servekit.yaml"]
    synced = storage.sync(folder, lambda versions: versions)
    assert synced.versions == {1: folder} and not synced.errors


def test_the_planner_polls_the_store_new_versions_in_removed_ones_out(s3_env):
    put(s3_env, "poll", {"iris/1/model.joblib": b"1", "iris/2/model.joblib": b"2"})
    folder = storage.prepare("s3://poll/iris")
    planner = Planner({"iris": folder})
    planner.refresh()
    assert list(planner.plan["models"]["iris"]["versions"]) == [2]
    put(s3_env, "poll", {"iris/3/model.joblib": b"3"})
    assert planner.refresh()
    doc = planner.plan["models"]["iris"]
    assert list(doc["versions"]) == [3] and doc["on_disk"] == [1, 2, 3]
    assert (folder / "3" / "model.joblib").read_bytes() == b"3"
    assert (folder / "2").is_dir()  # the version it replaces stays one poll longer
    planner.refresh()
    assert not (folder / "2").exists()
    s3_env.delete("poll", "iris/3")
    planner.refresh()
    assert list(planner.plan["models"]["iris"]["versions"]) == [2]  # version 3 left the store
    assert not (folder / "3").exists() and (folder / "2" / "model.joblib").read_bytes() == b"2"


def test_a_model_folder_added_to_a_bucket_repository_is_found_by_name(s3_env):
    put(s3_env, "late", {"models/iris/1/model.joblib": b"1"})
    folder = storage.prepare("s3://late/models")
    planner = Planner({"iris": folder / "iris"}, roots=[folder], explicit=True)
    planner.refresh()
    put(s3_env, "late", {"models/wine/1/model.joblib": b"w1", "models/wine/2/model.joblib": b"w2"})
    assert planner.refresh()  # the next poll lists it, not loaded (explicit model control), as a local one
    wine = planner.plan["models"]["wine"]
    assert not wine["enabled"] and "not loaded" in wine["reason"]
    assert (folder / "wine" / "2" / "model.joblib").read_bytes() == b"w2"  # mirrored by its own policy
    assert not (folder / "wine" / "1").exists()
    planner.enable("wine")
    planner.refresh()
    assert list(planner.plan["models"]["wine"]["versions"]) == [2]
    # a load by name finds a folder that landed after the last poll
    put(s3_env, "late", {"models/oak/1/model.joblib": b"o1"})
    planner.enable("oak")
    planner.refresh()
    assert list(planner.plan["models"]["oak"]["versions"]) == [1]
    assert storage.source_of(folder / "oak")[1]["uri"] == "s3://late/models/oak"


def test_a_bucket_repository_that_stops_answering_keeps_its_models(s3_env, monkeypatch, caplog):
    put(s3_env, "gone", {"models/iris/1/model.joblib": b"1"})
    folder = storage.prepare("s3://gone/models")
    planner = Planner({"iris": folder / "iris"}, roots=[folder], explicit=True)
    planner.refresh()
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "wrong")
    planner.refresh()
    planner.refresh()
    said = [r.getMessage() for r in caplog.records if "no new model folder" in r.getMessage()]
    assert len(said) == 1 and "s3://gone/models: access denied" in said[0]  # once, naming the URI
    assert list(planner.plan["models"]["iris"]["versions"]) == [1]


def test_the_operators_policy_decides_what_is_downloaded(s3_env):
    put(s3_env, "policy", {"iris/1/model.joblib": b"1", "iris/2/model.joblib": b"2"})
    folder = storage.prepare("s3://policy/iris")
    planner = Planner({"iris": folder})
    planner.entries["iris"].overrides = {"version_policy": {"specific": {"versions": [1]}}}
    planner.refresh()
    assert list(planner.plan["models"]["iris"]["versions"]) == [1]
    assert (folder / "1" / "model.joblib").read_bytes() == b"1"


def test_a_store_that_stops_answering_leaves_the_cache_serving(s3_env, monkeypatch):
    put(s3_env, "flaky", {"iris/1/model.joblib": b"1"})
    folder = storage.prepare("s3://flaky/iris")
    planner = Planner({"iris": folder})
    planner.refresh()
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "wrong")  # the store refuses from now on
    synced = storage.sync(folder, lambda versions: versions)
    assert "s3://flaky/iris: access denied" in synced.error
    planner.refresh()
    assert list(planner.plan["models"]["iris"]["versions"]) == [1]
    assert (folder / "1" / "model.joblib").is_file()


def test_a_missing_bucket_or_prefix_is_named(s3_env):
    with pytest.raises(storage.StorageError, match=r"s3://no-such-bucket/models: not found \(no such bucket"):
        storage.prepare("s3://no-such-bucket/models")
    put(s3_env, "exists", {"other/1/model.joblib": b"1"})
    with pytest.raises(storage.StorageError, match=r"s3://exists/models: not found"):
        storage.prepare("s3://exists/models")


def test_bad_or_missing_credentials_are_named(s3_env, monkeypatch):
    put(s3_env, "creds", {"iris/1/model.joblib": b"1"})
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "not-the-secret")
    with pytest.raises(storage.StorageError, match=r"s3://creds/iris: access denied \(check the credentials\)"):
        storage.prepare("s3://creds/iris")
    monkeypatch.delenv("AWS_ACCESS_KEY_ID")
    monkeypatch.delenv("AWS_SECRET_ACCESS_KEY")
    with pytest.raises(storage.StorageError, match=r"s3://creds/iris: access denied.*credentials"):
        storage.prepare("s3://creds/iris")


def test_a_missing_extra_is_named(monkeypatch):
    monkeypatch.setitem(sys.modules, "s3fs", None)  # as if servekit[s3] were not installed
    with pytest.raises(storage.StorageError, match=r"pip install 'servekit\[s3\]'"):
        filesystems._make("s3://b/m")
    monkeypatch.setitem(sys.modules, "gcsfs.core", None)
    with pytest.raises(storage.StorageError, match=r"pip install 'servekit\[gcs\]'"):
        filesystems._make("gs://b/m")


# -- Google Cloud Storage -----------------------------------------------------------------------


@pytest.fixture(scope="module")
def gcs(tmp_path_factory):
    server = GCSServer(tmp_path_factory.mktemp("gcs"))
    yield server
    server.stop()


def test_gs_paths_through_a_gcs_emulator(gcs, monkeypatch, tmp_path):
    from gcsfs.core import GCSFileSystem

    monkeypatch.setenv("STORAGE_EMULATOR_HOST", gcs.endpoint)
    monkeypatch.setenv(storage.CACHE_ENV, str(tmp_path))
    fs = GCSFileSystem(token="anon", skip_instance_cache=True)
    fs.mkdir("gcs-models")
    fs.pipe({"gcs-models/iris/1/model.joblib": b"one", "gcs-models/iris/2/model.joblib": b"two"})
    folder = storage.prepare("gs://gcs-models/iris")
    assert tree(folder) == ["2", "2/model.joblib"]
    fs.pipe("gcs-models/iris/3/model.joblib", b"three")
    synced = storage.sync(folder, lambda versions: versions[-1:])
    assert sorted(synced.versions) == [1, 2, 3] and (folder / "3" / "model.joblib").read_bytes() == b"three"
    with pytest.raises(storage.StorageError, match=r"gs://no-such-bucket/iris: not found"):
        storage.prepare("gs://no-such-bucket/iris")


# -- http(s) archives --------------------------------------------------------------------------


def tar_gz(files: dict[str, bytes]) -> bytes:
    out = io.BytesIO()
    with tarfile.open(fileobj=out, mode="w:gz") as archive:
        for name, data in files.items():
            info = tarfile.TarInfo(name)
            info.size = len(data)
            archive.addfile(info, io.BytesIO(data))
    return out.getvalue()


def zip_bytes(files: dict[str, bytes]) -> bytes:
    out = io.BytesIO()
    with zipfile.ZipFile(out, "w") as archive:
        for name, data in files.items():
            archive.writestr(name, data)
    return out.getvalue()


def test_an_archive_is_unpacked_and_fetched_again_only_when_it_changes(archives, monkeypatch, tmp_path):
    monkeypatch.setenv(storage.CACHE_ENV, str(tmp_path))
    (archives.folder / "iris.tar.gz").write_bytes(tar_gz({"1/model.joblib": b"one"}))
    folder = storage.prepare(f"{archives.url}/iris.tar.gz")
    assert folder.name == "iris" and tree(folder) == ["1", "1/model.joblib"]
    stamp = (folder / "1" / "model.joblib").stat().st_mtime_ns
    assert storage.sync(folder, lambda v: v).versions is None  # an archive's versions are read locally
    assert (folder / "1" / "model.joblib").stat().st_mtime_ns == stamp
    (archives.folder / "iris.tar.gz").write_bytes(tar_gz({"1/model.joblib": b"one", "2/model.joblib": b"twotwo"}))
    storage.sync(folder, lambda v: v)
    assert tree(folder) == ["1", "1/model.joblib", "2", "2/model.joblib"]


def test_a_zip_of_a_repository(archives, monkeypatch, tmp_path):
    monkeypatch.setenv(storage.CACHE_ENV, str(tmp_path))
    (archives.folder / "repo.zip").write_bytes(zip_bytes({"iris/1/model.joblib": b"1", "wine/model.joblib": b"w"}))
    folder = storage.prepare(f"{archives.url}/repo.zip")
    assert tree(folder) == ["iris", "iris/1", "iris/1/model.joblib", "wine", "wine/model.joblib"]
    assert storage.source_of(folder / "iris")[0] == folder  # its models sync through the archive


def test_a_truncated_or_escaping_archive_is_refused(archives, monkeypatch, tmp_path):
    monkeypatch.setenv(storage.CACHE_ENV, str(tmp_path))
    (archives.folder / "truncated-iris.tar.gz").write_bytes(tar_gz({"1/model.joblib": b"one" * 100}))
    with pytest.raises(storage.StorageError, match="truncated-iris.tar.gz"):
        storage.prepare(f"{archives.url}/truncated-iris.tar.gz")
    assert not storage.local_path(f"{archives.url}/truncated-iris.tar.gz").exists()
    (archives.folder / "evil.zip").write_bytes(zip_bytes({"../outside": b"x"}))
    with pytest.raises(storage.StorageError, match="leaves its folder"):
        storage.prepare(f"{archives.url}/evil.zip")
    with pytest.raises(storage.StorageError, match="not found"):
        storage.prepare(f"{archives.url}/missing.tar.gz")


# -- end to end: the real server over the real stores -----------------------------------------------

SETOSA = [5.1, 3.5, 1.4, 0.2]


@pytest.fixture(scope="module")
def stored_iris(s3, tmp_path_factory):
    """Iris versions 1 and 2 (``version_policy: all``) in ``s3://e2e/models/iris``."""
    from sklearn_models import fit_iris

    build = tmp_path_factory.mktemp("iris_build")
    fit_iris(build / "iris", 1)
    fit_iris(build / "iris", 2)
    (build / "iris" / "servekit.yaml").write_text("version_policy: all\n")
    s3.client.create_bucket(Bucket="e2e")
    s3.upload(build / "iris", "e2e", "models/iris")
    return build / "iris"


def predict_v1(url: str, version: int) -> requests.Response:
    return requests.post(f"{url}/v1/models/iris/versions/{version}:predict", json={"instances": [SETOSA]}, timeout=30)


def served_versions(url: str) -> dict[str, str]:
    answer = requests.get(f"{url}/v1/models/iris", timeout=30).json()
    return {s["version"]: s["state"] for s in answer.get("model_version_status", [])}


def wait_for(condition, timeout: float = 90.0) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if condition():
            return
        time.sleep(0.25)
    raise TimeoutError("the condition never held")


@pytest.mark.slow
def test_a_model_in_s3_serves_v1_and_v2_from_two_workers_and_takes_a_new_version(s3, stored_iris, tmp_path):
    import tritonclient.http as httpclient

    env = {**s3.env(), storage.CACHE_ENV: str(tmp_path / "cache")}
    server = ServerProcess("s3://e2e/models/iris", env=env, workers=2).start(timeout=180)
    try:
        for version in (1, 2):
            answer = predict_v1(server.url, version)
            assert answer.status_code == 200 and answer.json() == {"predictions": ["setosa"]}
        client = httpclient.InferenceServerClient(server.url.removeprefix("http://"))
        inputs = []
        for name, value in zip(("sepal_length", "sepal_width", "petal_length", "petal_width"), SETOSA, strict=True):
            inputs.append(httpclient.InferInput(name, [1], "FP64"))
            inputs[-1].set_data_from_numpy(np.array([value]))
        assert client.infer("iris", inputs).as_numpy("predict").tolist() == [b"setosa"]
        assert not list((tmp_path / "cache").glob("*/iris/3"))  # nothing of version 3 yet

        s3.upload(stored_iris / "2", "e2e", "models/iris/3")  # a new version lands in the bucket
        wait_for(lambda: served_versions(server.url).get("3") == "AVAILABLE")
        # every worker serves it: twenty requests in a row answer from version 3
        wait_for(lambda: all(predict_v1(server.url, 3).status_code == 200 for _ in range(20)))
        assert served_versions(server.url) == {"1": "AVAILABLE", "2": "AVAILABLE", "3": "AVAILABLE"}
    finally:
        server.stop()
        s3.delete("e2e", "models/iris/3")


@pytest.mark.slow
def test_a_model_folder_uploaded_to_a_served_bucket_repository_loads_by_name(s3, stored_iris, tmp_path):
    env = {**s3.env(), storage.CACHE_ENV: str(tmp_path / "cache")}
    server = ServerProcess("s3://e2e/models", env=env, workers=2, model_control_mode="explicit").start(timeout=180)
    try:
        load = f"{server.url}/v2/repository/models/setosa/load"
        assert requests.post(load, timeout=60).status_code == 404  # not in the bucket yet
        s3.upload(stored_iris / "1", "e2e", "models/setosa/1")  # a new model folder lands in the bucket
        assert requests.post(load, timeout=60).status_code == 200
        body = {"instances": [SETOSA]}
        # both workers serve it
        for _ in range(10):
            answer = requests.post(f"{server.url}/v1/models/setosa:predict", json=body, timeout=30)
            assert answer.status_code == 200 and answer.json() == {"predictions": ["setosa"]}
    finally:
        server.stop()
        s3.delete("e2e", "models/setosa")


@pytest.mark.slow
def test_tfserving_cli_serves_a_model_base_path_in_s3(s3, stored_iris, tmp_path):
    grpc = pytest.importorskip("grpc")
    from tensorflow_serving.apis import model_management_pb2, model_service_pb2_grpc
    from tensorflow_serving.config import model_server_config_pb2
    from tfserving_binary import TFServing

    env = {**s3.env(), storage.CACHE_ENV: str(tmp_path / "cache")}
    with pytest.MonkeyPatch.context() as patch:  # the server process inherits the environment
        for key, value in env.items():
            patch.setenv(key, value)
        server = TFServing(tmp_path, "--model_name=iris", "--model_base_path=s3://e2e/models/iris")
    try:
        rest = f"http://127.0.0.1:{server.rest_port}"
        assert served_versions(rest) == {"1": "AVAILABLE", "2": "AVAILABLE"}
        assert predict_v1(rest, 2).json() == {"predictions": ["setosa"]}
        # HandleReloadConfigRequest with base paths in the bucket: a missing one is refused by name
        config = model_server_config_pb2.ModelServerConfig()
        entry = config.model_config_list.config.add()
        entry.name, entry.base_path = "flowers", "s3://e2e/models/no-such-model"
        with grpc.insecure_channel(f"127.0.0.1:{server.port}") as channel:
            stub = model_service_pb2_grpc.ModelServiceStub(channel)
            with pytest.raises(grpc.RpcError) as refused:
                stub.HandleReloadConfigRequest(model_management_pb2.ReloadConfigRequest(config=config), timeout=60)
            assert refused.value.code() == grpc.StatusCode.INVALID_ARGUMENT
            assert "s3://e2e/models/no-such-model: not found" in refused.value.details()
            entry.base_path = "s3://e2e/models/iris"
            reply = stub.HandleReloadConfigRequest(model_management_pb2.ReloadConfigRequest(config=config), timeout=60)
        assert reply.status.error_code == 0
        answer = requests.post(f"{rest}/v1/models/flowers:predict", json={"instances": [SETOSA]}, timeout=30)
        assert answer.json() == {"predictions": ["setosa"]}
    finally:
        server.stop()


@pytest.mark.slow
def test_tfserving_model_config_file_with_a_base_path_in_s3(s3, stored_iris, tmp_path):
    from tfserving_binary import TFServing

    config = tmp_path / "models.config"
    config.write_text(
        'model_config_list {\n  config {\n    name: "flowers"\n    base_path: "s3://e2e/models/iris"\n'
        "    model_version_policy { specific { versions: 1 } }\n  }\n}\n"
    )
    env = {**s3.env(), storage.CACHE_ENV: str(tmp_path / "cache")}
    with pytest.MonkeyPatch.context() as patch:
        for key, value in env.items():
            patch.setenv(key, value)
        server = TFServing(tmp_path, f"--model_config_file={config}")
    try:
        rest = f"http://127.0.0.1:{server.rest_port}"
        status = requests.get(f"{rest}/v1/models/flowers", timeout=30).json()["model_version_status"]
        assert [(s["version"], s["state"]) for s in status] == [("1", "AVAILABLE")]
        answer = requests.post(f"{rest}/v1/models/flowers:predict", json={"instances": [SETOSA]}, timeout=30)
        assert answer.json() == {"predictions": ["setosa"]}
    finally:
        server.stop()
    # the config's policy decided what was downloaded: version 1 only
    (folder,) = (tmp_path / "cache").glob("*/iris")
    assert sorted(p.name for p in folder.iterdir() if not p.name.startswith(".")) == ["1", "servekit.yaml"]


@pytest.mark.slow
@pytest.mark.parametrize(
    ("uri", "env_change", "expected"),
    [
        ("s3://no-such-bucket/iris", {}, "s3://no-such-bucket/iris: not found (no such bucket"),
        ("s3://e2e/models/iris", {"AWS_SECRET_ACCESS_KEY": "wrong"}, "s3://e2e/models/iris: access denied"),
    ],
)
def test_serve_refuses_an_unreadable_uri_in_one_line(s3, stored_iris, tmp_path, uri, env_change, expected):
    env = {**os.environ, **s3.env(**env_change), storage.CACHE_ENV: str(tmp_path / "cache")}
    done = subprocess.run(
        [sys.executable, "-m", "servekit", "serve", uri, "--host", "127.0.0.1", "--grpc-port", "0"],
        env=env,
        capture_output=True,
        text=True,
        timeout=180,
    )
    assert done.returncode == 2
    lines = done.stderr.strip().splitlines()
    assert lines[-1].startswith(f"servekit: {expected}"), done.stderr[-2000:]
    assert "Traceback" not in done.stderr


@pytest.mark.slow
def test_an_http_archive_is_served(archives, tmp_path):
    from sklearn_models import fit_iris

    fit_iris(tmp_path / "build" / "iris", 1)
    with tarfile.open(archives.folder / "flowers.tar.gz", "w:gz") as archive:
        archive.add(tmp_path / "build" / "iris" / "1", arcname="1")
    env = {storage.CACHE_ENV: str(tmp_path / "cache")}
    server = ServerProcess(f"{archives.url}/flowers.tar.gz", env=env).start(timeout=180)
    try:
        answer = requests.post(f"{server.url}/v1/models/flowers:predict", json={"instances": [SETOSA]}, timeout=30)
        assert answer.json() == {"predictions": ["setosa"]}
    finally:
        server.stop()


@pytest.mark.slow
def test_a_version_uploaded_under_64_connections_fails_no_request(s3, stored_iris, tmp_path):
    """The issue's bar: 64 connections send requests while a new version lands in the bucket."""
    import threading

    s3.upload(stored_iris / "1", "e2e", "load/iris/1")  # latest policy: version 1 only
    env = {**s3.env(), storage.CACHE_ENV: str(tmp_path / "cache")}
    server = ServerProcess("s3://e2e/load/iris", env=env, workers=2).start(timeout=180)
    body = {
        "inputs": [
            {"name": n, "datatype": "FP64", "shape": [1], "data": [v]}
            for n, v in zip(("sepal_length", "sepal_width", "petal_length", "petal_width"), SETOSA, strict=True)
        ]
    }
    stop = threading.Event()
    failures: list[str] = []
    versions: list[str] = []
    first_v2: list[float] = []

    def send() -> None:
        with requests.Session() as session:
            while not stop.is_set():
                try:
                    answer = session.post(f"{server.url}/v2/models/iris/infer", json=body, timeout=60)
                except requests.RequestException as exc:
                    failures.append(repr(exc))
                    continue
                if answer.status_code != 200:
                    failures.append(f"{answer.status_code} {answer.text[:200]}")
                else:
                    versions.append(answer.json()["model_version"])
                    if versions[-1] == "2" and not first_v2:
                        first_v2.append(time.monotonic())

    threads = [threading.Thread(target=send, daemon=True) for _ in range(64)]
    try:
        for thread in threads:
            thread.start()
        wait_for(lambda: len(versions) > 64)
        started = time.monotonic()
        s3.upload(stored_iris / "2", "e2e", "load/iris/2")
        uploaded = time.monotonic()
        wait_for(lambda: versions[-64:].count("2") == 64, timeout=120)
        every = time.monotonic()
        poll = server.settings["poll_interval"]
        print(
            f"version 2 uploaded in {uploaded - started:.2f} s; from the upload's end its first answer after "
            f"{first_v2[0] - uploaded:.2f} s, every request's after {every - uploaded:.2f} s (poll period {poll} s)"
        )
    finally:
        stop.set()
        for thread in threads:
            thread.join(60)
        server.stop()
        s3.delete("e2e", "load/iris")
    assert not failures, failures[:5]
    assert versions[0] == "1" and versions[-1] == "2"
