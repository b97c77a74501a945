"""The artifact store: content addresses, atomic publication, validation with errors that name the bad file."""

from __future__ import annotations

import json
import os
from pathlib import Path

import numpy as np
import pytest
from pydantic import ValidationError

from storage import ArtifactError, ArtifactStore, InputError
from storage.manifest import stage_key
from storage.zarr_io import open_group, read_array, write_array


def _body(writer):
    writer.write_json("data.json", {"a": 1})
    g = open_group(writer.file_url("arr.zarr"), mode="w")
    write_array(g, "x", np.arange(100, dtype=np.float32).reshape(25, 4), chunk_rows=8)
    writer.summary["rows"] = 25


def test_key_depends_on_every_input():
    base = stage_key("s", 1, {"a": 1}, {"up": "k1"})
    assert base == stage_key("s", 1, {"a": 1}, {"up": "k1"})
    assert len({base, stage_key("s", 2, {"a": 1}, {"up": "k1"}),
                stage_key("s", 1, {"a": 2}, {"up": "k1"}),
                stage_key("s", 1, {"a": 1}, {"up": "k2"}),
                stage_key("t", 1, {"a": 1}, {"up": "k1"})}) == 5


def test_build_writes_manifest_last_and_publishes(tmp_path: Path):
    store = ArtifactStore(tmp_path)
    m = store.build("s", 1, {"a": 1}, {}, _body)
    final = tmp_path / "s" / m.key
    assert (final / "manifest.json").is_file()
    assert m.files["data.json"] == (final / "data.json").stat().st_size
    assert any(f.startswith("arr.zarr/x/c/") for f in m.files)
    assert m.summary == {"rows": 25} and m.params == {"a": 1} and "numpy" in m.libraries
    assert not [p for p in (tmp_path / "s").iterdir() if p.name.startswith(".tmp")]
    # a second build finds the first: the body does not run again
    again = store.build("s", 1, {"a": 1}, {}, lambda w: pytest.fail("body ran twice"))
    assert again.build_id == m.build_id
    assert [b["key"] for b in store.builds()] == [m.key]


def test_failed_build_leaves_nothing(tmp_path: Path):
    store = ArtifactStore(tmp_path)

    def broken(writer):
        _body(writer)
        raise RuntimeError("killed mid-stage")

    with pytest.raises(RuntimeError):
        store.build("s", 1, {}, {}, broken)
    assert not (tmp_path / "s").exists()   # not even an empty stage directory


def test_missing_or_resized_file_is_detected(tmp_path: Path):
    store = ArtifactStore(tmp_path)
    m = store.build("s", 1, {}, {}, _body)
    final = tmp_path / "s" / m.key
    (final / "data.json").write_text('{"a": 123456789}')
    with pytest.raises(ArtifactError, match=r"data\.json has \d+ bytes, manifest says"):
        store.load("s", m.key)
    os.remove(final / "data.json")
    with pytest.raises(ArtifactError, match=r"incomplete: .*data\.json is missing"):
        store.load("s", m.key)
    assert store.find("s", m.key) is None
    # rebuilding replaces the invalid artifact
    rebuilt = store.build("s", 1, {}, {}, _body)
    assert rebuilt.build_id != m.build_id and store.find("s", m.key) is not None


def test_corrupted_manifest_names_the_file(tmp_path: Path):
    store = ArtifactStore(tmp_path)
    m = store.build("s", 1, {}, {}, _body)
    (tmp_path / "s" / m.key / "manifest.json").write_text("{not json")
    with pytest.raises(ArtifactError, match=r"corrupted manifest .*manifest\.json"):
        store.load("s", m.key)
    (tmp_path / "s" / m.key / "manifest.json").write_text(json.dumps({"stage": "s"}))
    with pytest.raises(ArtifactError, match="missing fields"):
        store.load("s", m.key)


def test_corrupted_chunk_fails_its_checksum(tmp_path: Path):
    store = ArtifactStore(tmp_path)
    m = store.build("s", 1, {}, {}, _body)
    chunk = tmp_path / "s" / m.key / "arr.zarr" / "x" / "c" / "1" / "0"
    data = bytearray(chunk.read_bytes())
    data[5] ^= 0xFF
    chunk.write_bytes(bytes(data))
    store.load("s", m.key)  # same size: only the codec can tell
    with pytest.raises(ArtifactError, match=r"corrupted chunk .*x"):
        read_array(open_group(store.url("s", m.key, "arr.zarr")), "x")


def test_unwritable_root_is_a_clear_error(tmp_path: Path):
    blocker = tmp_path / "file"
    blocker.write_text("")
    store = ArtifactStore(blocker / "artifacts")  # a path under a regular file cannot be created, even by root
    with pytest.raises(InputError, match="not writable"):
        store.check_writable()


def test_concurrent_publish_keeps_the_first(tmp_path: Path):
    store = ArtifactStore(tmp_path)
    key = stage_key("s", 1, {}, {})
    with store.writing("s", key, version=1, params={}, upstream={}) as w1:
        _body(w1)
        with store.writing("s", key, version=1, params={}, upstream={}) as w2:
            _body(w2)
    assert w1.manifest.build_id == w2.manifest.build_id
    assert sorted(p.name for p in (tmp_path / "s").iterdir()) == [key]


def test_forced_build_replaces_a_valid_artifact(tmp_path: Path):
    store = ArtifactStore(tmp_path)
    first = store.build("s", 1, {}, {}, _body)
    again = store.build("s", 1, {}, {}, _body, force=True)
    assert again.build_id != first.build_id
    assert store.load("s", first.key).build_id == again.build_id
    assert sorted(p.name for p in (tmp_path / "s").iterdir()) == [first.key]


def _unreproducible(writer):
    _body(writer)
    writer.reproducible = False   # as KaMinPar on several threads, or training on a GPU


def test_what_rests_on_a_rebuilt_unreproducible_build_is_rebuilt_and_nothing_else(tmp_path: Path):
    """A rebuild of a build that is not reproducible may differ under the same key: what was made from the old one
    (here two generations down) is rebuilt, and its checks see it; a reproducible rebuild keeps what rests on it."""
    store = ArtifactStore(tmp_path)
    up = store.build("up", 1, {}, {}, _unreproducible)
    mid = store.build("mid", 1, {}, {"up": up}, _body)
    down = store.build("down", 1, {}, {"mid": mid}, _body)
    assert not up.reproducible and up.upstream_builds == {}
    assert mid.upstream_builds == down.upstream_builds == {"up": up.build_id}
    assert store.find("mid", mid.key, {"up": up}) == mid

    up2 = store.build("up", 1, {}, {}, _unreproducible, force=True)
    assert store.find("mid", mid.key) == mid and store.find("mid", mid.key, {"up": up2}) is None
    # what a stage asks before it plans memory or opens an executor: the same answer as build's
    assert store.cached("mid", 1, {}, {"up": up}) == mid and store.cached("mid", 1, {}, {"up": up2}) is None
    assert store.cached("mid", 2, {}, {"up": up}) is None and store.cached("mid", 1, {"p": 1}, {"up": up}) is None
    mid2 = store.build("mid", 1, {}, {"up": up2}, _body)
    assert mid2.key == mid.key and mid2.build_id != mid.build_id and mid2.upstream_builds == {"up": up2.build_id}
    down2 = store.build("down", 1, {}, {"mid": mid2}, _body)   # mid is reproducible, yet rests on the new up
    assert down2.key == down.key and down2.build_id != down.build_id
    assert sorted(p.name for p in (tmp_path / "mid").iterdir()) == [mid.key]   # replaced, not beside
    # upstreams made from two builds of one stage are refused: what rests on both would mix them
    with pytest.raises(ArtifactError, match=r"rest on two builds of up \("):
        store.build("both", 1, {}, {"mid": mid2, "down": down}, _body)

    # a reproducible upstream rebuilt (say after `gnnpipe verify` found damage) keeps what was made from it
    r = store.build("r", 1, {}, {}, _body)
    on_r = store.build("on_r", 1, {}, {"r": r}, _body)
    r2 = store.build("r", 1, {}, {}, _body, force=True)
    assert r2.build_id != r.build_id and on_r.upstream_builds == {}
    assert store.build("on_r", 1, {}, {"r": r2}, lambda w: pytest.fail("rebuilt")) == on_r


def test_manifests_written_before_reproducibility_load_as_reproducible(tmp_path: Path):
    store = ArtifactStore(tmp_path)
    m = store.build("s", 1, {}, {}, _body)
    path = tmp_path / "s" / m.key / "manifest.json"
    old = {k: v for k, v in json.loads(path.read_text()).items() if k not in ("reproducible", "upstream_builds")}
    path.write_text(json.dumps(old))
    assert store.load("s", m.key).reproducible and store.find("s", m.key, {}) is not None


def test_manifest_is_typed_and_its_json_keeps_its_keys(tmp_path: Path):
    store = ArtifactStore(tmp_path)
    m = store.build("s", 1, {"a": 1}, {}, _body)
    on_disk = json.loads((tmp_path / "s" / m.key / "manifest.json").read_text())
    assert set(on_disk) == {"stage", "version", "key", "params", "upstream", "created", "files", "bytes", "summary",
                            "libraries", "uri", "build_id", "origin", "digests", "reproducible", "upstream_builds"}
    assert m.model_dump() == on_disk and m.bytes == sum(m.files.values())
    # every file but the Zarr chunks has a crc32c (the chunks carry their own, in the codec)
    assert sorted(m.digests) == sorted(f for f in m.files if "/c/" not in f) and "arr.zarr/x/zarr.json" in m.digests
    assert all(d.startswith("crc32c:") for d in m.digests.values())
    with pytest.raises(ValidationError):
        m.key = "other"   # frozen
    down = store.build("t", 1, {}, {"s": m}, _body)
    assert down.upstream == {"s": m.key} and down.key == stage_key("t", 1, {}, {"s": m.key})
    (tmp_path / "s" / m.key / "manifest.json").write_text(json.dumps({**on_disk, "files": ["data.json"]}))
    with pytest.raises(ArtifactError, match=r"corrupted manifest .*manifest\.json \(bad fields: files\)"):
        store.load("s", m.key)


def test_a_killed_builds_scratch_dir_is_removed_by_the_next_attempt(tmp_path):
    """A stage SIGKILLed while it spills leaves ``<stage>/.tmp-<key>-<id>-scratch-<id>`` (its ``with`` never
    exits): the next attempt at the key removes it with the work directory, before it starts."""
    from storage import leftovers

    store = ArtifactStore(str(tmp_path))
    with store.writing("partition", "0123456789abcdef", version=1, params={}, upstream={}) as writer:
        scratch_cm = writer.scratch()
        scratch = scratch_cm.__enter__()   # left open, as a kill leaves it
        (Path(scratch) / "indices.npy").write_bytes(b"x" * 10)
    assert Path(scratch).is_dir()   # the publish does not touch it: only the next attempt or clean does
    removed = leftovers.remove_unfinished(store, "partition", "0123456789abcdef")
    assert Path(scratch) in removed and not Path(scratch).exists()
