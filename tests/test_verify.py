"""``gnnpipe verify`` (issue "[1/5] A killed run must never block the next one", item 4): a byte flipped in a stored
file is found, named (stage, file or array and chunk) with the command that rebuilds it, without a forced run.

Before: a run compared sizes only, so the damage surfaced when a later forced stage read it; there was no command.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Any

import pytest

from flows.cli_verify import built_with
from flows.config import STAGES
from storage import ArtifactError, ArtifactStore, Manifest
from storage import inventory as inv
from storage.train import MODEL
from storage.verify import verify_build
from tests._cli_runs import cli, gnnpipe
from tests._train_pipeline import build_without_prefect

ORIGIN = "gnnpipe run --until hotness --set num_nodes=1500 --set num_partitions=2"
SETS = ["--set", "num_nodes=1500", "--set", "num_partitions=2"]


@pytest.fixture(scope="module")
def built(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, dict[str, Manifest]]:
    """download → hotness of a small graph through the real stages (~3 s), recorded as built by ``ORIGIN``."""
    root = tmp_path_factory.mktemp("verify") / "art"
    with inv.building_for(ORIGIN):
        _, manifests = build_without_prefect({"artifacts": str(root), "num_nodes": 1500, "num_partitions": 2,
                                              "until": "hotness"})
    return root, manifests


@pytest.fixture
def root(built: tuple[Path, dict[str, Manifest]], tmp_path: Path) -> tuple[Path, dict[str, Manifest]]:
    """A copy of the built root for a test to damage."""
    src, manifests = built
    shutil.copytree(src, tmp_path / "art")
    return tmp_path / "art", manifests


def flip(path: Path) -> None:
    """One bit flipped mid-file: same size, so only a checksum can tell."""
    data = bytearray(path.read_bytes())
    data[len(data) // 2] ^= 0x10
    path.write_bytes(bytes(data))


def lines(result: Any) -> dict[str, str]:
    """``verify``'s lines by stage (one build each here)."""
    return {line.split()[0]: line for line in result.stdout.splitlines()}


def test_a_clean_root_passes(built):
    root, manifests = built
    result = cli("verify", "--artifacts", str(root))
    assert result.exit_code == 0, result.stdout
    assert list(lines(result)) == list(manifests)
    for name, line in lines(result).items():
        assert line.split()[1:] == [manifests[name].key, "ok"]   # every file had a checksum: nothing size-only


def test_a_flipped_byte_in_a_features_chunk_is_named_with_its_rebuild(root):
    """Was: unnoticed while everything downstream was cached; now one line names stage, array and chunk, and the
    `error:` line the command that rebuilds it, with the --set of the command that built it."""
    path, manifests = root
    key = manifests["features"].key
    chunk = next(rel for rel in manifests["features"].files if rel.startswith("part-1.zarr/x/") and "/c/" in rel)
    flip(path / "features" / key / chunk)
    proc = gnnpipe("verify", "--artifacts", str(path))
    assert proc.returncode == 2, proc.stdout + proc.stderr
    by_stage = {line.split()[0]: line for line in proc.stdout.splitlines()}
    assert by_stage["features"] == (f"features   {key}  DAMAGED  array part-1.zarr/x/node, chunk (0, 0) ({chunk}): "
                                    f"fails its crc32c")
    assert [by_stage[s].split()[2] for s in ("download", "partition", "hotness")] == ["ok"] * 3
    error = proc.stderr.strip().splitlines()
    assert len(error) == 1, proc.stderr
    assert error[0] == (f"error: features {key} is damaged: rerun the features stage to rebuild it: `gnnpipe run "
                        f"--force features` (or `gnnpipe stage features`) with `{' '.join(SETS)} --artifacts {path}`,"
                        f" the --config/--set that built it. The builds downstream of it keep their keys: they stay "
                        f"valid only if the rebuild is byte-identical (a stage that is not reproducible rebuilds "
                        f"them itself), else force them too")


@pytest.mark.parametrize("stage", ["hotness", "train"])
def test_a_damaged_file_outside_zarr_is_found(root, stage: str):
    """A file with no codec of its own (the hotness curve's png; a model) is checked against its manifest's crc32c."""
    path, manifests = root
    store = ArtifactStore(path)
    if stage == "train":   # a build holding a model file, without training one
        params = STAGES["train"].Params().key_params()
        manifests["train"] = store.build("train", STAGES["train"].VERSION, params, {"hotness": manifests["hotness"]},
                                         lambda w: w.write_bytes(MODEL, bytes(range(256)) * 64))
    rel = {"hotness": "curve.png", "train": MODEL}[stage]
    flip(path / stage / manifests[stage].key / rel)
    with pytest.raises(ArtifactError, match=f"^{stage} {manifests[stage].key} is damaged: rerun the {stage} stage"):
        cli("verify", stage, "--artifacts", str(path))
    verdict = verify_build(store, stage, manifests[stage].key)
    assert verdict.damage.startswith(f"{rel}: content changed (crc32c:")


def test_verify_stage_checks_that_stage_only(root):
    path, manifests = root
    chunk = next(rel for rel in manifests["features"].files if "/c/" in rel)
    flip(path / "features" / manifests["features"].key / chunk)
    result = cli("verify", "partition", "--artifacts", str(path))
    assert result.exit_code == 0 and list(lines(result)) == ["partition"]
    # with a config: that config's build of the stage, and the hint repeats the --set given
    result = cli("verify", "hotness", *SETS, "--artifacts", str(path))
    assert result.exit_code == 0 and list(lines(result)) == ["hotness"]
    with pytest.raises(ArtifactError, match=f"^features {manifests['features'].key} is damaged: .* with "
                                            f"`{' '.join(SETS)} --artifacts {path}`\\. The builds downstream"):
        cli("verify", "features", *SETS, "--artifacts", str(path))
    result = cli("verify", "features", "--set", "num_nodes=999", "--artifacts", str(path))
    assert result.exit_code == 0 and result.stdout.split()[2:] == ["not", "built", "for", "this", "config"]


def test_a_missing_file_is_reported(root):
    """A deleted chunk: `status` calls the build unusable; verify names the file and the rebuild."""
    path, manifests = root
    key = manifests["partition"].key
    rel = next(rel for rel in manifests["partition"].files if rel.startswith("part-0.zarr/indices/c/"))
    (path / "partition" / key / rel).unlink()
    with pytest.raises(ArtifactError, match=f"^partition {key} is damaged: rerun the partition stage"):
        cli("verify", "--artifacts", str(path))
    assert verify_build(ArtifactStore(path), "partition", key).damage == f"{rel}: missing"


def test_a_manifest_without_checksums_is_size_checked_and_says_so(root):
    """Builds made before manifests recorded checksums still load and verify; the files it could only size-check
    are named (a flipped byte in one of them goes unseen: the Zarr chunks are still checked by their codec)."""
    path, manifests = root
    build = path / "hotness" / manifests["hotness"].key
    data = json.loads((build / "manifest.json").read_text())
    del data["digests"]
    (build / "manifest.json").write_text(json.dumps(data))
    flip(build / "curve.png")
    assert ArtifactStore(path).load("hotness", manifests["hotness"].key).digests == {}
    line = lines(cli("verify", "hotness", "--artifacts", str(path)))["hotness"]
    size_only = sorted(f for f in manifests["hotness"].files if "/c/" not in f)
    assert line.startswith(f"hotness    {manifests['hotness'].key}  ok, but {len(size_only)} files size-checked only "
                           f"(its manifest records no checksum for them): {', '.join(size_only[:3])} and ")


def test_the_hint_without_a_recorded_command(root):
    """A build from a deployment's flow run (or one that recorded nothing) names no command line to copy."""
    assert built_with(ORIGIN) == SETS
    assert built_with("gnnpipe stage train -c big.yaml --set=epochs=5 --artifacts x") == ["--config", "big.yaml",
                                                                                         "--set", "epochs=5"]
    assert built_with("gnnpipe run") == [] and built_with("flow run brisk-otter") is None and built_with("") is None
    path, manifests = root
    build = path / "download" / manifests["download"].key
    data = json.loads((build / "manifest.json").read_text())
    (build / "manifest.json").write_text(json.dumps({**data, "origin": "flow run brisk-otter"}))
    flip(build / "graph.zarr" / "zarr.json")
    with pytest.raises(ArtifactError, match=r"download stage to rebuild it: .* with the --config/--set that built it "
                                            r"\(flow run brisk-otter\)\. The builds downstream"):
        cli("verify", "download", "--artifacts", str(path))
    verdict = verify_build(ArtifactStore(path), "download", manifests["download"].key)
    assert verdict.damage.startswith("graph.zarr/zarr.json: content changed")
