"""Fixtures shared by several test folders: a real S3-compatible server on loopback; and the
suite's bytecode, compiled once.

``s3_bucket`` gives a fresh bucket (``s3://...``) on one moto server per test process, started
in its own thread on 127.0.0.1 and a free port; clients find it through ``AWS_ENDPOINT_URL``
with dummy keys, as a user points them at an S3-compatible store. Tests that need it skip, with
the reason, where moto or s3fs is not installed.

Where ``PYTHONDONTWRITEBYTECODE`` is set, no interpreter caches what it compiles, and each of the
hundreds of processes the tests start (servers, torchrun's workers, scripts) would compile
feedline's modules again: ~0.7 s of the ~1.6 s of CPU a server took to start on a 2-core machine.
The suite's first process compiles them (and the tests' helper modules) once, before any test
runs, into the ``__pycache__`` folders every interpreter reads.
"""

from __future__ import annotations

import compileall
import contextlib
import json
import logging
import os
import re
import sys
import urllib.request
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

import feedline


def pytest_configure(config: pytest.Config) -> None:
    """Compile feedline and the tests' helper modules once, in the first process only (an
    xdist worker has ``workerinput``), where interpreters cache no bytecode of their own."""
    if not sys.dont_write_bytecode or hasattr(config, "workerinput"):
        return
    # Test modules are rewritten by pytest into bytecode of its own; their helpers are not.
    tests = re.compile(r"(^|/)(test_[^/]*|conftest)\.py$")
    for folder, skip in ((Path(feedline.__file__).parent, None), (Path(__file__).parent, tests)):
        compileall.compile_dir(folder, quiet=2, rx=skip, workers=0)


_ENV = {
    "AWS_ACCESS_KEY_ID": "testing",
    "AWS_SECRET_ACCESS_KEY": "testing",
    "AWS_DEFAULT_REGION": "us-east-1",
}


def start_s3_server() -> tuple[Any, str]:
    """A moto S3 server on 127.0.0.1 and a free port, and its endpoint URL."""
    server_module = pytest.importorskip("moto.server", reason="the S3 tests need moto[server]")
    pytest.importorskip("s3fs", reason="s3:// URLs need s3fs (pip install feedline[s3])")
    logging.getLogger("werkzeug").setLevel(logging.ERROR)
    server = server_module.ThreadedMotoServer(ip_address="127.0.0.1", port=0, verbose=False)
    server.start()
    host, port = server.get_host_and_port()
    return server, f"http://{host}:{port}"


def _reset_auth(endpoint: str, count: bytes) -> None:
    request = urllib.request.Request(
        f"{endpoint}/moto-api/reset-auth",
        data=count,
        method="POST",
        headers={"Content-Type": "text/plain"},
    )
    urllib.request.urlopen(request, timeout=30).close()


@contextlib.contextmanager
def credential_checked_s3() -> Iterator[tuple[str, Callable[[], None]]]:
    """A moto S3 server of its own (credential checks stay on for the rest of its life) with a
    fresh bucket: yields the bucket's URL and a function that turns the checks on, after which
    every request must carry valid keys. The checks (a per-process setting of moto), the
    environment and fsspec's cached clients are restored at the end."""
    import s3fs

    server, endpoint = start_s3_server()
    bucket = f"guarded-{uuid.uuid4().hex[:12]}"  # moto's buckets are shared by its servers
    saved = dict(os.environ)

    def check_credentials() -> None:
        _reset_auth(endpoint, b"0")
        s3fs.S3FileSystem.clear_instance_cache()

    try:
        os.environ.update(_ENV, AWS_ENDPOINT_URL=endpoint)
        s3fs.S3FileSystem.clear_instance_cache()
        s3fs.S3FileSystem(skip_instance_cache=True).mkdir(bucket)
        yield f"s3://{bucket}", check_credentials
    finally:
        _reset_auth(endpoint, b"inf")
        os.environ.clear()
        os.environ.update(saved)
        s3fs.S3FileSystem.clear_instance_cache()
        server.stop()


def new_s3_user_options() -> dict[str, Any]:
    """``storage_options`` holding the keys of a new user of the S3 server that
    ``AWS_ENDPOINT_URL`` names, allowed every S3 action, and its endpoint: the credentials a
    call gets only through its ``storage_options`` once ``credential_checked_s3``'s checks are
    on (the environment's dummy keys are refused then). Made before the checks are on."""
    import boto3

    endpoint = os.environ["AWS_ENDPOINT_URL"]
    iam = boto3.client("iam", endpoint_url=endpoint, region_name="us-east-1")
    user = f"trainer-{uuid.uuid4().hex[:8]}"
    iam.create_user(UserName=user)
    policy = {
        "Version": "2012-10-17",
        "Statement": [{"Effect": "Allow", "Action": "s3:*", "Resource": "*"}],
    }
    iam.put_user_policy(UserName=user, PolicyName="s3", PolicyDocument=json.dumps(policy))
    key = iam.create_access_key(UserName=user)["AccessKey"]
    return {
        "key": key["AccessKeyId"],
        "secret": key["SecretAccessKey"],
        "client_kwargs": {"endpoint_url": endpoint},
    }


@pytest.fixture(scope="session")
def s3_endpoint() -> Iterator[str]:
    server, endpoint = start_s3_server()
    saved = {key: os.environ.get(key) for key in (*_ENV, "AWS_ENDPOINT_URL")}
    os.environ.update(_ENV, AWS_ENDPOINT_URL=endpoint)
    try:
        yield endpoint
    finally:
        server.stop()
        for key, value in saved.items():
            if value is None:
                os.environ.pop(key, None)
            else:
                os.environ[key] = value


@pytest.fixture
def s3_bucket(s3_endpoint: str) -> str:
    """A new, empty bucket on the test process's S3 server, as ``s3://name``."""
    import s3fs

    # Another test of this process (a doc snippet with a server of its own) may have pointed
    # the environment elsewhere, and fsspec keeps the clients it made: point them back here.
    os.environ.update(_ENV, AWS_ENDPOINT_URL=s3_endpoint)
    s3fs.S3FileSystem.clear_instance_cache()
    name = f"feedline-{uuid.uuid4().hex[:16]}"
    s3fs.S3FileSystem(skip_instance_cache=True).mkdir(name)
    return f"s3://{name}"
