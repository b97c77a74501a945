"""OGB node-property datasets (ogbn-arxiv, ogbn-products, ogbn-papers100M, ogbn-mag) → ``storage.graph.Graph``.

Downloading and parsing OGB's on-disk format is left to the ``ogb`` package (``NodePropPredDataset``); this module
makes it safe to run unattended and converts its output to the canonical form.

``ogb`` 1.3.6 needs three adjustments, applied only while it runs (see :func:`unattended_ogb`):

- it asks ``input()`` before downloading more than 1 GB (products, papers100M) and when a dataset directory has no
  current ``RELEASE_v<version>.txt``; a pipeline worker has no terminal, so the download is approved up front (the
  user named the dataset) and the directory question becomes an InputError (delete it and rerun);
- it reloads its own cache file ``processed/data_processed`` (and papers100M's ``split_dict.pt`` from the zip)
  with ``torch.load``, whose ``weights_only=True`` default (PyTorch >= 2.6) rejects those pickles (ogb issue #497,
  PR #507), so they are loaded with ``weights_only=False``, as ogb did before PyTorch 2.6: trust them as much as
  the OGB download and ``root``;
- its ``torch.save`` of that cache assumes ``processed/`` exists; it is created first.

The link datasets' loader (``stages.download.ogbl_source``) shares these adjustments and the error handling
(``unattended_ogb``, ``ogb_errors``) for ``ogb.linkproppred``.

ogbn-mag is heterogeneous: ogb reads its per-type raw files (``read_csv_heterograph_raw``) into per-type dicts,
which become a ``stages.download.typed.TypedSource`` (node types in ogb's sorted order: author, field_of_study,
institution, paper; labels and the time split on paper) and go through the typed graph builder, reverse relations
added on request (``add_reverse``: the OGB R-GCN baseline trains on them; without them a paper hears from no field
of study and no institution).

Layout under ``root`` (ogb's): ``<root>/<name with '_' for '-'>/{RELEASE_v1.txt, raw/, split/<kind>/, processed/}``,
e.g. ``<root>/ogbn_products/``. The zip is downloaded to ``<root>/<download_name>.zip`` and removed after
extraction.
"""

from __future__ import annotations

import contextlib
import functools
import importlib
import os
import types
import urllib.error
import zipfile
from collections.abc import Iterator
from typing import Any

import numpy as np
import torch

from stages.choices import OGB_DATASETS
from stages.download.canonical import check_finite, csr_with_edge_attr, to_csr_incoming
from storage.errors import InputError
from storage.graph import SPLITS, Graph
from storage.progress import progress as tqdm


def load_ogb(name: str, root: str, progress: bool = False, add_reverse: bool = True) -> Graph:
    """Download (if needed) and convert OGB dataset ``name``, keeping ogb's files under ``root``.

    ``directed`` follows OGB: products is undirected (OGB adds the inverse edges), arxiv and papers100M are
    directed citation graphs (u -> v: u cites v) and are kept directed, though many GNN setups symmetrise them.
    """
    if name not in OGB_DATASETS:
        raise InputError(f"unknown OGB dataset '{name}'; supported: {', '.join(OGB_DATASETS)}")
    steps = tqdm(total=3, desc=name, unit="step", disable=not progress, leave=False)
    dataset = _open_dataset(name, root)
    steps.update()
    with ogb_errors(name, root), unattended_ogb(dataset_dir(name, root)):
        split = dataset.get_idx_split()  # may torch.load split_dict.pt (papers100M)
    graph, labels = dataset[0]
    meta = dataset.meta_info
    if str(meta["is hetero"]) == "True":
        steps.close()
        return _typed_graph(name, graph, labels, split, int(dataset.num_classes), meta, add_reverse)
    undirected = str(meta["add_inverse_edge"]) == "True"
    num_nodes = int(graph["num_nodes"])
    edge_index = graph.pop("edge_index")  # release ogb's copy as soon as the CSR exists (2 GB at products)
    # OGB already added the inverse edges where it says so: symmetrising again would only double the sort.
    edge_attr = _edge_features(graph.pop("edge_feat", None), int(edge_index.shape[1]), name)
    if edge_attr is None:
        indptr, indices = to_csr_incoming(edge_index[0], edge_index[1], num_nodes, directed=True)
    else:
        indptr, indices, edge_attr = csr_with_edge_attr(edge_index[0], edge_index[1], num_nodes, edge_attr,
                                                        directed=True)
    del edge_index
    steps.update()
    result = Graph.homogeneous(indptr=indptr, indices=indices, x=node_features(graph.get("node_feat"), num_nodes),
                               y=_labels(labels, num_nodes), splits=_splits(split, num_nodes),
                               num_classes=int(dataset.num_classes), directed=not undirected, name=name,
                               source=f"ogb:{name} (v{meta['version']}, {meta['url']})", edge_attr=edge_attr)
    steps.update()
    steps.close()
    return result


def _typed_graph(name: str, graph: dict[str, Any], labels: dict[str, Any], split: dict[str, Any],
                 num_classes: int, meta: Any, add_reverse: bool) -> Graph:
    """ogb's heterogeneous dicts (per-type ids) → the typed graph (``stages.download.typed``)."""
    from stages.download.typed import TypedSource, build_graph
    from storage.schema import EdgeType

    num_nodes = {t: int(n) for t, n in sorted(graph["num_nodes_dict"].items())}
    edges = {EdgeType(*triplet): (np.asarray(ei[0]), np.asarray(ei[1]))
             for triplet, ei in sorted(graph["edge_index_dict"].items())}
    features = {t: node_features(x, num_nodes[t]) for t, x in (graph.get("node_feat_dict") or {}).items()
                if x is not None}
    typed_labels = {t: (_labels(y, num_nodes[t]), num_classes) for t, y in labels.items()}
    splits = {t: _splits({s: split[s][t] for s in SPLITS}, num_nodes[t]) for t in split["train"]}
    source = TypedSource(num_nodes, edges, features, typed_labels, splits, name=name,
                         source=f"ogb:{name} (v{meta['version']}, {meta['url']})")
    return build_graph(source, add_reverse=add_reverse)


def _open_dataset(name: str, root: str) -> Any:
    """``NodePropPredDataset(name, root)``, downloading on first use."""
    from ogb.nodeproppred import NodePropPredDataset  # imported late: ogb pulls in pandas, and not every run needs it

    os.makedirs(root, exist_ok=True)
    with ogb_errors(name, root), unattended_ogb(dataset_dir(name, root)):
        return NodePropPredDataset(name=name, root=root)


@contextlib.contextmanager
def ogb_errors(name: str, root: str) -> Iterator[None]:
    """ogb's failures (network, corrupt zip, missing files) as one-line InputErrors that say what to do."""
    try:
        yield
    except urllib.error.URLError as err:
        raise InputError(f"could not download {name} ({err.reason}); check the network, or put the extracted "
                         f"dataset at {dataset_dir(name, root)}") from None
    except zipfile.BadZipFile:
        raise InputError(f"the downloaded {name} archive in {root} is corrupt (interrupted download?); delete the "
                         f".zip file there and rerun") from None
    except (RuntimeError, OSError) as err:  # interrupted download, missing raw/split files, unreadable cache
        raise InputError(f"could not load {name} from {dataset_dir(name, root)} ({err}); delete that directory "
                         f"and rerun to download it again") from None


def dataset_dir(name: str, root: str) -> str:
    return os.path.join(root, name.replace("-", "_"))  # ogb's naming: ogbn-arxiv -> ogbn_arxiv


@contextlib.contextmanager
def unattended_ogb(directory: str, ogb_module: types.ModuleType | None = None) -> Iterator[None]:
    """Patch ogb's dataset module for unattended use (module docstring), restoring it afterwards.

    ``ogb_module``: the module whose dataset class runs (default ``ogb.nodeproppred.dataset``); the link datasets'
    ``ogb.linkproppred.dataset`` prompts and loads the same way, through its own module globals."""
    ogb_dataset: Any = ogb_module or importlib.import_module("ogb.nodeproppred.dataset")

    def no_prompt(prompt: str = "") -> str:
        # With decide_download replaced, ogb's only remaining question is whether to replace a directory that
        # lacks the current RELEASE_v<version>.txt (an interrupted copy, or an older OGB release).
        raise InputError(f"{directory} is an incomplete or outdated OGB download (no current RELEASE_v*.txt); "
                         "delete it and rerun to download it again")

    saved = ogb_dataset.decide_download, ogb_dataset.torch
    ogb_dataset.decide_download = lambda url: True
    ogb_dataset.torch = types.SimpleNamespace(load=functools.partial(torch.load, weights_only=False),
                                              save=_save_creating_parent)
    ogb_dataset.input = no_prompt  # shadows the builtin inside that module only
    try:
        yield
    finally:
        ogb_dataset.decide_download, ogb_dataset.torch = saved
        del ogb_dataset.input


def _save_creating_parent(obj: Any, path: str, **kwargs: Any) -> None:
    os.makedirs(os.path.dirname(path), exist_ok=True)
    torch.save(obj, path, **kwargs)


def node_features(node_feat: np.ndarray | None, num_nodes: int) -> np.ndarray:
    if node_feat is None:  # not the case for the supported datasets, but the graph format needs features
        raise InputError("this OGB dataset has no node features; gnnpipe needs features")
    x = np.asarray(node_feat)
    if x.ndim != 2 or x.shape[0] != num_nodes:
        raise InputError(f"OGB node features have shape {x.shape}, expected ({num_nodes}, F); delete the "
                         "dataset directory and rerun to download it again")
    return x


def _edge_features(edge_feat: np.ndarray | None, num_edges: int, name: str) -> np.ndarray | None:
    """OGB's ``edge_feat`` [E, D] (ogbn-proteins: 8 columns) as float32, aligned with its ``edge_index``; None when
    the dataset has none."""
    if edge_feat is None:
        return None
    attr = np.asarray(edge_feat)
    if attr.ndim != 2 or attr.shape[0] != num_edges:
        raise InputError(f"OGB edge features of {name} have shape {attr.shape}, expected ({num_edges}, D); delete "
                         "the dataset directory and rerun to download it again")
    attr = attr.astype(np.float32, copy=False)
    check_finite(attr, f"the edge features (edge_feat) of dataset {name}")
    return attr


def _labels(labels: Any, num_nodes: int) -> np.ndarray:
    """[N, 1] labels (float with NaN for unlabelled nodes in papers100M) → int64 [N] with -1 for unlabelled."""
    lab = np.asarray(labels).reshape(-1)
    if lab.shape[0] != num_nodes:
        raise InputError(f"OGB labels have {lab.shape[0]} entries for {num_nodes} nodes; delete the dataset "
                         "directory and rerun to download it again")
    if not np.issubdtype(lab.dtype, np.floating):
        return lab.astype(np.int64)
    y = np.full(num_nodes, -1, dtype=np.int64)
    known = ~np.isnan(lab)
    y[known] = lab[known].astype(np.int64)
    return y


def _splits(split: dict[str, Any], num_nodes: int) -> dict[str, np.ndarray]:
    """OGB's train/valid/test index arrays (numpy or torch) → int64 [n] each."""
    out = {}
    for name in SPLITS:
        idx = np.asarray(split[name]).reshape(-1).astype(np.int64)
        if idx.size and (idx.min() < 0 or idx.max() >= num_nodes):
            raise InputError(f"OGB split '{name}' has node ids outside [0, {num_nodes}); delete the dataset "
                             "directory and rerun to download it again")
        out[name] = idx
    return out
