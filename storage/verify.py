"""Re-read a build's every byte against what its manifest recorded when it was built (``gnnpipe verify``).

A run trusts a cached build after comparing file sizes only (``ArtifactStore.load``: three small reads, not a hash
of gigabytes), so a flipped byte stays unnoticed until a forced stage decodes it. This reads everything, per build,
stopping at the first damage:

1. the manifest parses (``ArtifactStore.read_manifest``);
2. every file it lists exists with its recorded size (one listing, ``ArtifactStore.size_problem``);
3. every file with a recorded checksum (``Manifest.digests``: all but the Zarr chunks, ``storage.checksums``)
   matches it, streamed in 8 MiB reads; a manifest written before checksums were recorded has none, so its files
   are size-checked only, and named as such;
4. every stored chunk of every Zarr array is decoded, one at a time, so the array's crc32c codec checks it.

Memory: one chunk (~64 MiB, ``storage.zarr_io.DEFAULT_CHUNK_BYTES``) or one 8 MiB read at a time.
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass

import zarr
import zarr.codecs
from tqdm.auto import tqdm

from storage.checksums import digest_of, is_chunk, is_zarr_meta, node_dir, zarr_node
from storage.errors import ArtifactError
from storage.progress import progress
from storage.store import MANIFEST, ArtifactStore, Manifest
from storage.zarr_io import open_array_at


@dataclass(frozen=True)
class Verdict:
    """What ``verify_build`` found in one build."""

    stage: str
    key: str
    manifest: Manifest | None
    damage: str = ""                  # the first damaged file (or array and chunk) and what is wrong; "" if none
    size_only: tuple[str, ...] = ()   # files that could be size-checked only (no checksum recorded)

    @property
    def ok(self) -> bool:
        return not self.damage


def verify_build(store: ArtifactStore, stage: str, key: str, *, show_progress: bool = True) -> Verdict:
    """Read every byte of build ``stage/key`` and check it (module docstring); a progress bar on stderr when it is a
    terminal and ``show_progress``."""
    try:
        manifest = store.read_manifest(stage, key)
    except ArtifactError as err:
        return Verdict(stage, key, None, damage=f"{MANIFEST}: {err}")
    if (problem := store.size_problem(manifest)) is not None:
        rel, got = problem
        what = "missing" if got is None else f"{got} bytes, the manifest says {manifest.files[rel]}"
        return Verdict(stage, key, manifest, damage=f"{rel}: {what}")
    # disable=None: a bar on a terminal only, not \r-lines in a log or a test's captured stderr
    with progress(total=manifest.bytes, unit="B", unit_scale=True, desc=f"verify {stage} {key[:8]}",
                  disable=None if show_progress else True) as bar:
        damage, size_only = _check(store, manifest, bar)
    return Verdict(stage, key, manifest, damage=damage, size_only=tuple(size_only))


def _check(store: ArtifactStore, manifest: Manifest, bar: tqdm) -> tuple[str, list[str]]:
    """Steps 3 and 4: (the first damage or "", the files that could be size-checked only)."""
    base = store.url(manifest.stage, manifest.key)
    for rel, recorded in sorted(manifest.digests.items()):
        if (got := digest_of(store.fs, f"{base}/{rel}")) != recorded:
            return f"{rel}: content changed ({got}, the manifest says {recorded})", []
        bar.update(manifest.files.get(rel, 0))
    arrays: set[str] = set()
    for rel in filter(is_zarr_meta, manifest.files):
        node = zarr_node(store.fs.cat_file(f"{base}/{rel}"))
        if node is None:
            return f"{rel}: unreadable Zarr metadata", []
        if node == "array":
            arrays.add(node_dir(rel))
    size_only = [rel for rel in sorted(manifest.files) if rel not in manifest.digests and not is_chunk(rel, arrays)]
    for name in sorted(arrays):
        damage, unchecked = _check_chunks(f"{base}/{name}", name, manifest, bar)
        if damage:
            return damage, size_only
        size_only += unchecked
    return "", size_only


def _check_chunks(url: str, name: str, manifest: Manifest, bar: tqdm) -> tuple[str, list[str]]:
    """Decode every stored chunk of the array ``name``: (the first damaged one or "", its chunks if its codecs carry
    no crc32c, so that decoding them proves little)."""
    try:
        arr = open_array_at(url)
    except Exception as err:  # noqa: BLE001 - whatever zarr makes of broken metadata, the array is damaged
        return f"array {name}: cannot be opened ({type(err).__name__}: {err})", []
    stored = []
    for coords in itertools.product(*(range(n) for n in arr.cdata_shape)):
        rel = f"{name}/{arr.metadata.encode_chunk_key(coords)}"
        if rel not in manifest.files:   # never written: it reads as the fill value, nothing stored to damage
            continue
        try:
            arr.get_block_selection(coords)
        except Exception as err:  # noqa: BLE001 - any failure to decode a stored chunk is damage, named as such
            why = "fails its crc32c" if "checksum" in str(err).lower() else f"{type(err).__name__}: {err}"
            return f"array {name}, chunk {coords} ({rel}): {why}", []
        stored.append(rel)
        bar.update(manifest.files[rel])
    checked = any(isinstance(c, zarr.codecs.Crc32cCodec) for c in arr.compressors)
    return "", [] if checked else stored
