"""Real storage servers on loopback for the storage tests: moto's S3 server, a GCS emulator, http.server.

Each runs as its own process (or, for the archive server, a thread of the test
process serving files from a folder); the server under test reaches them with
the real client libraries (s3fs/botocore, gcsfs, aiohttp), nothing patched.
"""

from __future__ import annotations

import functools
import http.server
import json
import shutil
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

import pytest


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _wait_port(port: int, proc: subprocess.Popen, log: Path, timeout: float = 120.0) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"storage server exited {proc.returncode}:\n{log.read_text()[-3000:]}")
        with socket.socket() as s:
            if s.connect_ex(("127.0.0.1", port)) == 0:
                return
        time.sleep(0.2)
    raise TimeoutError(f"storage server not listening on {port}:\n{log.read_text()[-3000:]}")


def _stop(proc: subprocess.Popen) -> None:
    proc.terminate()
    try:
        proc.wait(15)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()


class S3Server:
    """moto's standalone S3 server with authentication on: only a key it issued is accepted.

    ``INITIAL_NO_AUTH_ACTION_COUNT`` lets the first three requests through unsigned
    checks: they create the IAM user, its policy and its access key.
    """

    def __init__(self, folder: Path):
        pytest.importorskip("moto.server", reason="moto[server] is not installed (pip install 'servekit[test]')")
        self.port = free_port()
        self.endpoint = f"http://127.0.0.1:{self.port}"
        self.log = folder / "moto.log"
        env = {"INITIAL_NO_AUTH_ACTION_COUNT": "3", "PATH": "/usr/bin:/bin"}
        with self.log.open("w") as out:
            self.proc = subprocess.Popen(
                [sys.executable, "-m", "moto.server", "-H", "127.0.0.1", "-p", str(self.port)],
                stdout=out,
                stderr=subprocess.STDOUT,
                env=env,
            )
        _wait_port(self.port, self.proc, self.log)
        import boto3

        iam = boto3.client(
            "iam", endpoint_url=self.endpoint, region_name="us-east-1", aws_access_key_id="x", aws_secret_access_key="x"
        )
        iam.create_user(UserName="servekit-tests")
        policy = {"Version": "2012-10-17", "Statement": [{"Effect": "Allow", "Action": "*", "Resource": "*"}]}
        iam.put_user_policy(UserName="servekit-tests", PolicyName="all", PolicyDocument=json.dumps(policy))
        key = iam.create_access_key(UserName="servekit-tests")["AccessKey"]
        self.key_id, self.secret = key["AccessKeyId"], key["SecretAccessKey"]
        self.client = boto3.client(
            "s3",
            endpoint_url=self.endpoint,
            region_name="us-east-1",
            aws_access_key_id=self.key_id,
            aws_secret_access_key=self.secret,
        )

    def env(self, **changes: str) -> dict[str, str]:
        """The environment a client of this server runs with (the standard AWS variables)."""
        return {
            "AWS_ACCESS_KEY_ID": self.key_id,
            "AWS_SECRET_ACCESS_KEY": self.secret,
            "AWS_REGION": "us-east-1",
            "AWS_ENDPOINT_URL": self.endpoint,
            "AWS_EC2_METADATA_DISABLED": "true",
            "AWS_SHARED_CREDENTIALS_FILE": "/nonexistent",
            "AWS_CONFIG_FILE": "/nonexistent",
            **changes,
        }

    def upload(self, folder: Path, bucket: str, prefix: str) -> None:
        """Every file under ``folder`` to ``s3://bucket/prefix/...``."""
        for file in sorted(folder.rglob("*")):
            if file.is_file():
                self.client.upload_file(str(file), bucket, f"{prefix}/{file.relative_to(folder).as_posix()}")

    def delete(self, bucket: str, prefix: str) -> None:
        listed = self.client.list_objects_v2(Bucket=bucket, Prefix=prefix + "/").get("Contents", [])
        for item in listed:
            self.client.delete_object(Bucket=bucket, Key=item["Key"])

    def stop(self) -> None:
        _stop(self.proc)


class GCSServer:
    """gcp-storage-emulator, in memory; gcsfs finds it through ``STORAGE_EMULATOR_HOST``."""

    def __init__(self, folder: Path):
        binary = Path(sys.executable).parent / "gcp-storage-emulator"
        if not binary.exists() and shutil.which("gcp-storage-emulator") is None:
            pytest.skip("gcp-storage-emulator is not installed (pip install 'servekit[test]')")
        self.port = free_port()
        self.endpoint = f"http://127.0.0.1:{self.port}"
        self.log = folder / "gcs.log"
        with self.log.open("w") as out:
            self.proc = subprocess.Popen(
                [str(binary), "start", "--host", "127.0.0.1", "--port", str(self.port), "--in-memory"],
                stdout=out,
                stderr=subprocess.STDOUT,
            )
        _wait_port(self.port, self.proc, self.log)

    def env(self) -> dict[str, str]:
        return {"STORAGE_EMULATOR_HOST": self.endpoint}

    def stop(self) -> None:
        _stop(self.proc)


class _Files(http.server.SimpleHTTPRequestHandler):
    """Files of a folder; a name starting ``truncated-`` announces 1000 bytes more than it sends."""

    def log_message(self, *args: Any) -> None:  # quiet
        pass

    def send_head(self) -> Any:
        name = self.path.rsplit("/", 1)[-1]
        if not name.startswith("truncated-"):
            return super().send_head()
        data = (Path(self.directory) / name).read_bytes()
        self.send_response(200)
        self.send_header("Content-Type", "application/gzip")
        self.send_header("Content-Length", str(len(data) + 1000))
        self.end_headers()
        self.close_connection = True
        import io

        return io.BytesIO(data)


class ArchiveServer:
    """``http.server`` on loopback serving a folder of archives, in a thread of the test process."""

    def __init__(self, folder: Path):
        self.folder = folder
        handler = functools.partial(_Files, directory=str(folder))
        self.httpd = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
        self.url = f"http://127.0.0.1:{self.httpd.server_address[1]}"
        self.thread = threading.Thread(target=self.httpd.serve_forever, daemon=True)
        self.thread.start()

    def stop(self) -> None:
        self.httpd.shutdown()
        self.httpd.server_close()
