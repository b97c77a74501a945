"""Download stage: a dataset (synthetic, OGB or the user's .npy files) → the canonical ``graph.zarr``.

Contract: params → artifact ``download/<key>/graph.zarr`` (format in ``storage.graph``). A graph larger than
``memory_budget_bytes`` streams through the external sort (``stages.download.streamed``), whose buckets run on the
``executor`` (``stages.sort_units``); the in-memory path and ``executor=local`` run in this process.
"""

from __future__ import annotations

import hashlib
import os
from collections.abc import Mapping
from typing import Any

from pydantic import Field, model_validator

from stages.choices import LINK_DATASETS, OGBL_DATASETS, TYPED_OGB_DATASETS, Dataset, TaskName
from stages.download.canonical import check_classes, check_finite
from stages.download.edge_split import check_link_split, link_edge_type_index, split_edges
from stages.download.streamed import choose, load_streamed
from stages.download.synthetic import check_synthetic, generate_synthetic
from stages.download.synthetic_hetero import check_synthetic_hetero, generate_synthetic_hetero, type_counts
from stages.download.typed_files import is_typed_dir, load_typed_files
from stages.memory import MemoryBudget
from stages.meter import measure
from stages.params import BudgetedParams, Seed, runtime
from stages.sort_units import sort_executor
from storage import ArtifactStore, InputError, Manifest, StageWriter
from storage.graph import Graph, write_graph
from storage.report import Report, markdown_table
from storage.schema import GraphSchema
from storage.summaries import DownloadSummary

NAME = "download"
VERSION = 2   # 2: typed graphs (graph.zarr holds a schema, x per node type, one CSR row per node and edge type)
LINK_FIELDS = ("task", "link_split", "link_edge_type")   # in the key only for task=link: node keys as before
UPSTREAM: tuple[str, ...] = ()


class Params(BudgetedParams):
    """What defines the dataset; ``key_params`` keeps only the fields that matter for the chosen one."""

    dataset: Dataset = Field("synthetic", description="synthetic, synthetic-hetero (MAG-like, typed) or "
                                                      "synthetic-link (task=link; no network), an OGB node "
                                                      "dataset, ogbl-collab or ogbl-citation2 (task=link, OGB's "
                                                      "split and evaluation negatives), or files")
    task: TaskName = Field("node", description="link: hold out link_split's valid/test edges of link_edge_type "
                                               "from the graph the samplers see (the train stage's task=link)")
    link_split: tuple[float, float, float] = Field((0.85, 0.05, 0.10), description="task=link: train, valid, "
                                                   "test fractions of link_edge_type's edges (split with seed; "
                                                   "ignored by ogbl-* datasets, which come split)")
    link_edge_type: str | None = Field(None, description="task=link on a typed graph: the edge type to predict "
                                                         "(src___rel___dst or a unique relation name; ignored by "
                                                         "ogbl-* datasets)")
    num_nodes: int = Field(100_000, ge=2, description="synthetic: nodes (synthetic-hetero: of all types, in "
                                                      "ogbn-mag's shares)")
    avg_degree: float = Field(20.0, gt=0, description="synthetic: mean in-degree after symmetrising")
    num_features: int = Field(64, ge=1, description="synthetic: feature columns (synthetic-hetero: papers')")
    num_classes: int = Field(16, ge=2, description="synthetic: classes")
    num_edge_features: int = Field(0, ge=0, description="synthetic: edge attribute columns (0: none); column 0 "
                                                        "says whether an edge's ends share a label, the rest is "
                                                        "noise (an edge-aware model can use them)")
    seed: Seed = Field(0, description="synthetic: generator seed")
    split: tuple[float, float, float] = Field((0.08, 0.02, 0.90),
                                              description="synthetic: train, valid, test fractions")
    add_reverse: bool = Field(True, description="typed graphs: add (dst, rev_<rel>, src) for each edge type "
                                                "between two node types and symmetrise those within one (PyG's "
                                                "ToUndirected)")
    path: str | None = Field(None, description="files: directory with edge_index.npy, x.npy, y.npy, ...")
    fingerprint: str | None = Field(None, description="files: overrides the files' fingerprint in the key "
                                                      "(default: names, sizes and mtimes)")
    download_dir: str | None = runtime(None, description="where OGB keeps its raw files (default "
                                                         "~/.cache/gnnpipe/ogb)")

    @model_validator(mode="after")
    def _check(self) -> Params:
        if self.dataset in LINK_DATASETS and self.task != "link":
            raise InputError(f"dataset {self.dataset} is made for link prediction: set task=link (the pipeline's "
                             f"task sets it in download, hotness and train)")
        if self.task == "link" and self.dataset not in OGBL_DATASETS:
            check_link_split(self.link_split)
        if self.dataset == "files" and not self.path:
            raise InputError("dataset 'files' needs path=<directory with edge_index.npy, x.npy, ...> (see README)")
        if self.num_edge_features and self.dataset != "synthetic":
            raise InputError(f"num_edge_features={self.num_edge_features} is for dataset synthetic; dataset "
                             f"{self.dataset} brings its own edge features (files: edge_attr.npy) or none")
        if self.dataset in ("synthetic", "synthetic-link"):
            check_synthetic(self.num_nodes, self.avg_degree, self.num_features, self.num_classes, self.split)
        if self.dataset == "synthetic-hetero":
            check_synthetic(self.num_nodes, self.avg_degree, self.num_features, self.num_classes, self.split)
            check_synthetic_hetero(self.num_nodes, self.num_classes)
        return self

    def key_params(self) -> dict[str, Any]:
        """Only the fields that matter for this dataset, so e.g. num_nodes does not re-key an OGB download; the
        link split's only for task=link (with the seed it is drawn with); an ogbl-* dataset comes with OGB's split,
        so link_split, link_edge_type and seed do not re-key it."""
        out = self._dataset_key()
        if self.dataset in OGBL_DATASETS:
            return out | {"task": self.task}
        if self.task == "link":
            out |= self.model_dump(mode="json", include=set(LINK_FIELDS) | {"seed"})
        return out

    def _dataset_key(self) -> dict[str, Any]:
        if self.dataset in ("synthetic", "synthetic-hetero", "synthetic-link"):
            typed = {"add_reverse"} if self.dataset == "synthetic-hetero" else set()
            # in the key only when set: graphs without edge features keep their keys
            edges = {"num_edge_features"} if self.dataset == "synthetic" and self.num_edge_features else set()
            out = self.model_dump(mode="json", include={"dataset", "num_nodes", "avg_degree", "num_features",
                                                        "num_classes", "seed", "split"} | typed | edges)
            if self.dataset == "synthetic-hetero":
                # the nodes per type, derived: the rule that splits num_nodes changed (it now sums exactly), and a
                # build under the old rule (5,001 nodes for 5,000) must not be found; re-keying this dataset alone
                # spares every other download the rebuild a VERSION bump would cost
                out["type_counts"] = type_counts(self.num_nodes, self.num_classes)
            return out
        if self.dataset == "files":
            path = os.path.abspath(self.path or "")
            reverse = {"add_reverse": self.add_reverse} if is_typed_dir(path) else {}
            return {"dataset": "files", "path": path, "fingerprint": self.fingerprint or files_fingerprint(path),
                    **reverse}
        return self.model_dump(mode="json", include={"dataset", "add_reverse"} if self.dataset in TYPED_OGB_DATASETS
                               else {"dataset"})


def files_fingerprint(directory: str) -> str:
    """Paths, sizes and mtimes of the user's .npy/.json files (as make does): cheap, and changes when they do. A
    typed layout's are in sub-folders; a flat directory's paths are the file names (its fingerprint as before)."""
    if not os.path.isdir(directory):
        raise InputError(f"dataset directory {directory} does not exist; pass path=<directory with .npy files>")
    h = hashlib.sha256()
    files = sorted(os.path.relpath(os.path.join(folder, name), directory)
                   for folder, _, names in os.walk(directory) for name in names if name.endswith((".npy", ".json")))
    for name in files:
        st = os.stat(os.path.join(directory, name))
        h.update(f"{name}:{st.st_size}:{st.st_mtime_ns};".encode())
    return h.hexdigest()[:16]


def load(params: Params, *, download_dir: str, progress: bool) -> Graph:
    """The dataset as a validated ``Graph`` (every source refuses non-finite features, ``check_finite``); for
    task=link its message-passing graph with the edge splits (``stages.download.edge_split``; an ogbl-* dataset's
    are OGB's, made by its loader)."""
    graph = load_dataset(params, download_dir=download_dir, progress=progress)
    if params.task != "link" or params.dataset in OGBL_DATASETS:
        return graph
    edge_type = link_edge_type_index(graph.schema.edge_types, params.link_edge_type)
    return split_edges(graph, edge_type, params.link_split, params.seed)[0]


def load_dataset(params: Params, *, download_dir: str, progress: bool) -> Graph:
    """The dataset as it comes, validated."""
    if params.dataset == "files":
        from stages.download.files_source import load_files

        path = os.path.abspath(params.path or "")
        if is_typed_dir(path):   # build_graph checks features and classes per type
            return load_typed_files(path, add_reverse=params.add_reverse)
        return load_files(path)   # names x.npy in its own finite check
    if params.dataset == "synthetic-hetero":   # build_graph checks features and classes per type
        return generate_synthetic_hetero(params.num_nodes, params.avg_degree, params.num_features,
                                         params.num_classes, params.seed, split=params.split,
                                         add_reverse=params.add_reverse)
    if params.dataset in OGBL_DATASETS:   # no labels to check (stages.download.ogbl_source)
        from stages.download.ogbl_source import load_ogbl

        graph = load_ogbl(params.dataset, download_dir, progress=progress)
        check_finite(graph.x, f"the features (x) of dataset {params.dataset}")
        return graph
    if params.dataset in ("synthetic", "synthetic-link"):
        graph = generate_synthetic(params.num_nodes, params.avg_degree, params.num_features, params.num_classes,
                                   params.seed, split=params.split, progress=progress,
                                   num_edge_features=params.num_edge_features, name=params.dataset)
    else:
        from stages.download.ogb_source import load_ogb

        graph = load_ogb(params.dataset, download_dir, progress=progress, add_reverse=params.add_reverse)
        if params.dataset in TYPED_OGB_DATASETS:   # build_graph checked features and classes per type
            return graph
    check_finite(graph.x, f"the features (x) of dataset {params.dataset}")
    check_classes(graph.y, graph.num_classes, f"dataset {params.dataset}")   # files: checked in load_files
    return graph


def run(store: ArtifactStore, params: Params, upstream: Mapping[str, Manifest], *, force: bool = False,
        progress: bool = True) -> Manifest:
    """Build (or find) the canonical graph for ``params``."""
    download_dir = params.download_dir or os.path.join(os.path.expanduser("~"), ".cache", "gnnpipe", "ogb")

    budget = MemoryBudget.resolve(params.memory_budget_bytes, NAME)

    def body(writer: StageWriter) -> None:
        with measure() as cost:
            # before any work: a budget neither path fits is one error line naming the minimum (streamed.choose)
            choice = choose(params, budget)
            if choice.streamed:
                with writer.scratch() as scratch:
                    with sort_executor(params.executor, store) as (executor, placed):   # the sort's buckets
                        graph, stream = load_streamed(params, budget, scratch, executor)
                    stream |= placed
                    attrs = write_graph(writer, graph, progress=progress)
                    sizes = _sizes(graph)   # before the scratch directory (indices, x) goes
            else:
                graph = load(params, download_dir=download_dir, progress=progress)
                attrs = write_graph(writer, graph, progress=progress)
                sizes, stream = _sizes(graph), {}
        writer.summary.update(attrs)
        writer.summary.update(cost)
        writer.summary.update(sizes)
        writer.summary.update(memory_budget_bytes=budget.bytes, memory_budget_source=budget.source,
                              canonical_path="external sort" if choice.streamed else "in-memory",
                              in_memory_estimate_bytes=choice.estimate, **stream)

    return store.build(NAME, VERSION, params.key_params(), upstream, body, force=force)


def _sizes(graph: Graph) -> dict[str, Any]:
    """The summary's size figures (bytes as computed in memory: int64 ids; on disk they may be int32)."""
    out = {"avg_degree": round(graph.num_edges / max(graph.num_nodes, 1), 3),
           "bytes_graph": int(graph.indptr.nbytes + graph.indices.nbytes),
           "bytes_features": sum(int(x.nbytes) for x in graph.features.values())}
    if graph.edge_attr is not None:
        out["bytes_edge_features"] = int(graph.edge_attr.nbytes)
    return out


def report(manifest: Manifest) -> Report:
    s = DownloadSummary.from_json(manifest.summary)
    rows = [{"dataset": s.name, "source": s.source, "nodes": s.num_nodes, "edges": s.num_edges,
             "avg_degree": s.avg_degree, "features": s.num_features, "classes": s.num_classes,
             "directed": s.directed, **{f"{k}_nodes": v for k, v in s.split_sizes.items()},
             "wall_s": s.wall_s, "peak_rss_GiB": round(s.peak_rss_bytes / 2**30, 2)}]
    schema = GraphSchema.from_dict(s.schema)
    typed = "" if schema.is_homogeneous else (f" ({len(schema.node_types)} node types, {schema.num_edge_types} "
                                              "edge types)")
    headline = (f"{s.name}: {s.num_nodes:,} nodes, {s.num_edges:,} edges{typed}, {s.num_features} "
                f"features, {s.num_classes} classes")
    if s.edge_split_sizes:   # task=link: the positives, and what the samplers' graph leaves out
        sizes = s.edge_split_sizes
        headline += (f"; link prediction on {s.link_edge_type}: {sizes['train']:,} train, {sizes['valid']:,} "
                     f"valid, {sizes['test']:,} test positives (valid and test held out of the graph)")
    md = f"## download `{manifest.key}`\n\n{headline}\n\n{markdown_table(rows)}\n"
    if not schema.is_homogeneous:
        md += _typed_tables(schema, s.edges_per_type)
    return Report(headline, rows, md)


def _typed_tables(schema: GraphSchema, edges_per_type: dict[str, int]) -> str:
    """Per node type and per edge type figures of a typed graph."""
    nodes = [{"node_type": t.name, "nodes": t.num_nodes, "features": t.num_features or "none (embeddings)",
              "classes": t.num_classes or ""} for t in schema.node_types]
    edges = [{"edge_type": e.key, "edges": edges_per_type[e.key]} for e in schema.edge_types]
    return f"\n{markdown_table(nodes)}\n\n{markdown_table(edges)}\n"
