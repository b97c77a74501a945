"""The whole pipeline, training included, with its artifact root on object storage: a local S3-compatible server
(moto) on loopback.

Credentials and endpoint come from the standard AWS environment variables, as they would on a cluster.
"""

from __future__ import annotations

import os
import socket
import subprocess
import time
import urllib.request
from typing import Any

import pytest

from storage import ArtifactStore
from storage.train_summary import TrainSummary
from tests.conftest import MOTO_ENV, TINY, moto_server_path

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def s3_endpoint():
    moto = moto_server_path()
    if moto is None:
        pytest.skip("moto_server not installed (pip install 'moto[server]')")
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    proc = subprocess.Popen([moto, "-H", "127.0.0.1", "-p", str(port)],
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True)
    url = f"http://127.0.0.1:{port}"
    try:
        for _ in range(100):
            try:
                urllib.request.urlopen(url, timeout=1)
                break
            except OSError:
                time.sleep(0.1)
        saved = {k: os.environ.get(k) for k in (*MOTO_ENV, "AWS_ENDPOINT_URL")}
        os.environ.update(**MOTO_ENV, AWS_ENDPOINT_URL=url)
        import s3fs

        s3fs.S3FileSystem.clear_instance_cache()
        s3fs.S3FileSystem().mkdir("gnnpipe-test")
        yield url
    finally:
        for k, v in saved.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v
        proc.terminate()
        proc.wait(timeout=10)


def test_pipeline_on_s3(prefect_server: str, s3_endpoint: str):
    from flows.pipeline import pipeline

    cfg: dict[str, Any] = {**TINY, "artifacts": "s3://gnnpipe-test/run", "until": "train", "fanouts": [5, 5],
                           "batch_size": 64, "hidden": 32, "epochs": 2}
    first = pipeline(**cfg)
    assert {n: r["state"] for n, r in first.items()} == dict.fromkeys(first, "Completed")
    store = ArtifactStore(cfg["artifacts"])
    for name, res in first.items():
        manifest = store.load(name, res["key"])
        assert manifest.uri.startswith("s3://gnnpipe-test/run/")
    # the ranks read their partitions and features from the bucket; the model and plots are published there
    train = store.load("train", first["train"]["key"])
    assert {"model.pt", "metrics.json", "curves.png"} <= set(train.files)
    assert train.summary["world_size"] == 2 and TrainSummary.from_json(train.summary).test_metric > 0.3
    assert not store.fs.exists(f"{store.base}/.checkpoints"), "checkpoints stay local, never in the bucket"
    again = pipeline(**cfg)
    assert {n: r["state"] for n, r in again.items()} == dict.fromkeys(first, "Cached")
    # a lost object invalidates its stage only
    victim = next(f for f in store.load("features", first["features"]["key"]).files if "/c/" in f)
    store.fs.rm_file(f"{store.base}/features/{first['features']['key']}/{victim}")
    third = pipeline(**cfg)
    assert third["features"]["state"] == "Completed"
    assert {third[n]["state"] for n in ("hotness", "train")} == {"Cached"}
    assert store.find("features", first["features"]["key"]) is not None
