"""``gnnpipe train``: this node's share of the train stage, on one host or on N hosts joined by torchrun's
rendezvous (one command per node, or one ``srun`` under Slurm).

The stages up to hotness run once, anywhere (``gnnpipe run --until hotness`` or a Prefect deployment); every node
then finds the same artifacts by the keys its config gives, and the ranks refuse to start unless every node reads
the same builds (``stages.train.spec.check_same_artifacts``). No Prefect server is involved: node 0 publishes the
train artifact into the store, where the flow finds it by key (a later ``gnnpipe run`` does not train again).
"""

from __future__ import annotations

import os
from pathlib import Path

import typer

from flows.builds import config_builds
from flows.config import PipelineConfig
from flows.load import load_config
from stages.jobs.cluster import DEFAULT_JOIN_TIMEOUT_S, DEFAULT_PORT, DEFAULT_RDZV_ID, Cluster, from_slurm
from stages.train import stage as train_stage
from storage import ArtifactStore, InputError, Manifest


def upstream_manifests(cfg: PipelineConfig, store: ArtifactStore) -> dict[str, Manifest]:
    """The train stage's inputs for ``cfg``, found by key; a missing one is a one-line error saying what to run."""
    builds = config_builds(store, cfg.model_copy(update={"until": "train"}))
    found: dict[str, Manifest] = {}
    for name in train_stage.UPSTREAM:
        build = builds[name]
        if build.manifest is None or build.state != "cached":
            why = "is not in" if build.manifest is None else \
                f"rests on another build of {', '.join(build.changed)} in"
            raise InputError(f"{name} artifact {build.key} {why} {store.root}: build the pipeline up to hotness "
                             f"once (`gnnpipe run --until hotness` with this config and artifact root), where every "
                             f"node can read it")
        found[name] = build.manifest
    return found


def cluster_from_options(nnodes: int, node_rank: int, rdzv: str | None, rdzv_id: str, local_addr: str | None,
                         slurm: bool, port: int, join_timeout_s: float) -> Cluster:
    if slurm:
        if rdzv or nnodes != 1 or node_rank:
            raise InputError("--slurm reads the nodes from the Slurm environment: drop --nnodes/--node-rank/--rdzv")
        return from_slurm(os.environ, port=port, join_timeout_s=join_timeout_s)
    return Cluster(nnodes=nnodes, node_rank=node_rank, rdzv_endpoint=rdzv, rdzv_id=rdzv_id, local_addr=local_addr,
                   join_timeout_s=join_timeout_s)


def register(app: typer.Typer) -> None:
    @app.command()
    def train(config: Path | None = typer.Option(None, "--config", "-c", help="YAML/TOML file of parameters"),
              set_: list[str] = typer.Option([], "--set", "-s", help="parameter override key=value (repeatable)"),
              artifacts: str | None = typer.Option(None, envvar="ARTIFACTS", help="artifact root (path or URL)"),
              nnodes: int = typer.Option(1, help="number of machines in the job"),
              node_rank: int = typer.Option(0, help="this machine's index, 0..nnodes-1; node 0 publishes"),
              rdzv: str | None = typer.Option(None, help="HOST:PORT of the rendezvous, the same on every node"),
              rdzv_id: str = typer.Option(DEFAULT_RDZV_ID, help="job name, the same on every node"),
              local_addr: str | None = typer.Option(None, help="this node's address as the others reach it"),
              slurm: bool = typer.Option(False, help="take nodes, node rank and rendezvous host from srun's env"),
              port: int = typer.Option(DEFAULT_PORT, help="rendezvous port with --slurm"),
              join_timeout: float = typer.Option(DEFAULT_JOIN_TIMEOUT_S, help="seconds to wait for all nodes"),
              force: bool = typer.Option(False, "--force", "-f", help="train even if the artifact exists")) -> None:
        """Train on this node's share of the ranks (one rank per partition, spread evenly over the nodes)."""
        cfg = load_config(config, set_, artifacts=artifacts)
        cluster = cluster_from_options(nnodes, node_rank, rdzv, rdzv_id, local_addr, slurm, port, join_timeout)
        cluster.check_fits(cfg.partition.num_partitions)   # "3 partitions on 2 nodes" before anything is read
        store = ArtifactStore(cfg.artifacts)
        upstream = upstream_manifests(cfg, store)
        if cluster.multi_node:
            typer.echo(f"node {cluster.node_rank}/{cluster.nnodes}: rendezvous {cluster.rdzv_endpoint} "
                       f"(id {cluster.rdzv_id}), artifacts {store.root}")
        if not cluster.publishes:
            train_stage.join(store, cfg.train, upstream, cluster=cluster, force=force, log=typer.echo)
            return
        manifest = train_stage.run(store, cfg.train, upstream, force=force, cluster=cluster, log=typer.echo)
        typer.echo("\n" + train_stage.report(manifest).markdown)
