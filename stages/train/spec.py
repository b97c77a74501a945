"""The job spec the stage writes for the ranks (a JSON file), and the lineage checks on the stage's inputs.

The spec names artifacts by key, never by path guesses: every rank opens the same artifact store and reads the
same manifests, and the keys tie the run to exactly the inputs that made its content address.
"""

from __future__ import annotations

import hashlib
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from stages.runtime.rank_process import JobSpec
from storage.errors import InputError
from storage.manifest import Manifest, library_versions
from storage.store import ArtifactStore
from storage.summaries import HotnessSummary, PartitionSummary
from storage.train import spec_path

_REPO = Path(__file__).resolve().parents[2]


@dataclass
class TrainSpec(JobSpec):
    JOB = "train"

    artifacts: str                 # artifact store root (local path or fsspec URL)
    key: str                       # the train artifact's key: checkpoints of another key are never resumed
    partition_key: str
    features_key: str
    hotness_key: str               # (the number of partitions, one rank each, is the partition book's bounds)
    params: dict[str, Any]         # stages.train.stage.Params, all fields (runtime ones included)
    checkpoint_dir: str            # local directory; each node's local rank 0 writes (stages.train.rank.checkpoint)
    result_dir: str                # local rank 0 writes model.pt and metrics.json here; ranks write error-<r>.json
    node_rank: int = 0             # this node (the user's --node-rank / SLURM_NODEID); 0 publishes the artifact
    fingerprint: dict[str, str] = field(default_factory=dict)   # artifact_fingerprint(): equal on every node
    # storage.manifest.builds_behind of the inputs: checkpoints made on other builds of them are never resumed
    upstream_builds: dict[str, str] = field(default_factory=dict)


def check_lineage(partition: Manifest, features: Manifest, hotness: Manifest) -> None:
    """The features and the cache plan must come from this very partitioning (their manifests' upstream keys).

    A plan from another partitioning names gids of a different relabelling: caching it would silently serve
    wrong rows, so refuse with a clear error.
    """
    pkey = partition.key
    for name, manifest in (("features", features), ("hotness", hotness)):
        got = manifest.upstream.get("partition")
        if got != pkey:
            raise InputError(f"the {name} artifact {manifest.key} was built on partition {got}, not on the "
                             f"partition {pkey} used for training; rebuild {name} on this partitioning")
    got = hotness.upstream.get("features")
    if got != features.key:
        raise InputError(f"the hotness artifact {hotness.key} was built on features {got}, not {features.key}; "
                         f"rebuild hotness on these features")
    parts = PartitionSummary.from_json(partition.summary).num_partitions
    planned = HotnessSummary.from_json(hotness.summary).num_partitions or parts   # 0: recorded none
    if planned != parts:
        raise InputError(f"the cache plan covers {planned} partitions but the partitioning has {parts}")


def checkpoints_of_other_builds(job: Path, builds: Mapping[str, str]) -> bool:
    """Whether the job directory ``job`` holds the spec of an attempt made on other builds of the inputs
    (``TrainSpec.upstream_builds``) than ``builds``: its checkpoints must not be resumed. A spec that cannot be
    read (cut short by a kill as it was written, or from another gnnpipe) counts as other builds: refusing it
    would stop every later attempt until `gnnpipe clean`."""
    path = spec_path(job)
    if not path.exists():
        return False
    try:
        return TrainSpec.load(path).upstream_builds != dict(builds)
    except InputError:
        return True


def check_world_size(world_size: int, num_partitions: int) -> None:
    """One rank per partition (docs/design.md §5): rank r loads partition r and owns its gid range."""
    if world_size != num_partitions:
        raise InputError(f"world size {world_size} != {num_partitions} partitions: training runs one rank per "
                         f"partition; launch {num_partitions} ranks or repartition into {world_size}")


def code_digest(root: Path = _REPO, extra: Sequence[Path] = ()) -> str:
    """A digest of the Python sources that run a training job (``storage/`` and ``stages/``, and ``extra``: the
    plug-in model's and loss's files, ``stages.train.models.plugins.plugin_files``): nodes on other commits, or with
    other plug-in code, could compute different things under the same keys, or disagree on a collective's protocol."""
    h = hashlib.sha256()
    for path in sorted(p for pkg in ("storage", "stages") for p in (root / pkg).rglob("*.py")):
        h.update(str(path.relative_to(root)).encode() + b"\0" + path.read_bytes() + b"\0")
    for path in extra:   # by name only: the same plug-in may live in another directory on another node
        h.update(path.name.encode() + b"\0" + path.read_bytes() + b"\0")
    return h.hexdigest()[:16]


def runtime_fingerprint(extra: Sequence[Path] = ()) -> str:
    """The code (``extra``: plug-in files) and the libraries whose versions must match across nodes (gloo/NCCL
    speak torch's protocol)."""
    versions = library_versions()
    return f"code {code_digest(extra=extra)}, torch {versions.get('torch', '?')}, python {versions['python']}"


def artifact_fingerprint(store: ArtifactStore, train_key: str, upstream: Mapping[str, Manifest],
                         code_files: Sequence[Path] = ()) -> dict[str, str]:
    """What a node trains on and with: the train key, per input artifact ``<key> build <digest>``, and the code
    (``code_files``: the plug-ins') and library versions (``runtime_fingerprint``).

    The digest is the SHA-256 of the manifest file, which records the build's id, its files and their sizes. Two
    builds of the same key (say, partitioned separately on two machines, where METIS may cut differently) have
    different digests; a byte-for-byte copy of one build has the same one. Chunk contents are guarded by their
    crc32c on every read.
    """
    out = {"train": train_key, "runtime": runtime_fingerprint(code_files)}
    for name, manifest in sorted(upstream.items()):
        digest = store.manifest_digest(name, manifest.key)
        out[name] = f"{manifest.key} build {digest}"
    return out


def check_same_artifacts(nodes: Sequence[Mapping[str, Any]]) -> None:
    """``nodes``: one record per rank, ``{"rank", "node", "host", "fingerprint"}``. Every rank must train on
    exactly the artifacts of the lowest node (node 0, which publishes); otherwise raise one line naming the first
    node that differs and how."""
    ordered = sorted(nodes, key=lambda rec: (rec["node"], rec["rank"]))
    ref = ordered[0]
    for rec in ordered[1:]:
        if rec["fingerprint"] == ref["fingerprint"]:
            continue
        diff = sorted(k for k in {*ref["fingerprint"], *rec["fingerprint"]}
                      if ref["fingerprint"].get(k) != rec["fingerprint"].get(k))
        what = "; ".join(f"{k}: {ref['fingerprint'].get(k)} on node {ref['node']} vs {rec['fingerprint'].get(k)} on "
                         f"node {rec['node']}" for k in diff)
        raise InputError(f"node {rec['node']} ({rec['host']}, rank {rec['rank']}) does not train on the artifacts of "
                         f"node {ref['node']} ({ref['host']}, rank {ref['rank']}): {what}. Build the pipeline up to "
                         f"hotness once, in an artifact root every node reads (shared directory or s3://), and "
                         f"start every node with the same config")
