"""OGB link-property datasets (ogbl-collab, ogbl-citation2) → a homogeneous ``storage.graph.Graph`` with OGB's split.

Parsing OGB's files is left to ``ogb`` (``LinkPropPredDataset``), run unattended as in ``ogb_source`` (its
``unattended_ogb`` patches ``ogb.linkproppred.dataset``, which prompts and ``torch.load``s as the node module does).
OGB fixes the evaluation protocol, so the split is OGB's, not ``link_split``'s:

- the message-passing CSR is OGB's *train* positives only (OGB's own graph object is exactly those): ogbl-collab is
  undirected, stored once per pair and year, so it is symmetrised and deduplicated; ogbl-citation2 is directed
  (source cites target) and kept so, deduplicated. Should a valid or test pair also be a train pair (collab is a
  multigraph over years: a pair may collaborate again later), it stays in the graph, as in OGB's graph (a time
  split: the past is observed, and scores stay comparable with OGB's); the summary counts such pairs
  (``link_held_out_in_graph``) so that no one mistakes them for a leak;
- ``edge_splits`` are OGB's positives per split as given (collab ``edge`` [E, 2]; citation2 ``source_node`` /
  ``target_node``), in OGB's order, collab's repeated train pairs included (OGB's baselines train on them);
- OGB's evaluation negatives are kept (``storage.graph``'s ``edge_split_neg``): collab's valid/test ``edge_neg``
  [E_neg, 2] is one set every positive is ranked against (``shared``, Hits@50); citation2's ``target_node_neg``
  [E, 1000] are per positive (``per-positive``, MRR), the negative pairs being (its source, each target);
- there are no node labels: y is all -1, ``num_classes`` 0 (the schema's "unlabelled type") and the node splits
  empty. The partition stage then balances in-edges only, which here are the train positives by dst: the seed edges
  each rank trains on.

Layout under ``root`` (ogb's): ``<root>/ogbl_collab/{RELEASE_v1.txt, raw/, split/time/{train,valid,test}.pt,
processed/}``; the zip is ``<root>/<download_name>.zip`` (collab.zip, citation-v2.zip).
"""

from __future__ import annotations

import importlib
import os
from typing import Any

import numpy as np

from stages.choices import OGBL_DATASETS
from stages.download.canonical import to_csr_incoming
from stages.download.ogb_source import dataset_dir, node_features, ogb_errors, unattended_ogb
from storage.errors import InputError
from storage.graph import SPLITS, Graph
from storage.progress import progress as tqdm

# per dataset: how its negatives are ranked (storage.graph.LINK_EVALS)
LINK_EVAL = {"ogbl-collab": "shared", "ogbl-citation2": "per-positive"}
EVAL_SPLITS = ("valid", "test")   # OGB gives negatives for these only


def load_ogbl(name: str, root: str, progress: bool = False) -> Graph:
    """Download (if needed) and convert OGB link dataset ``name``, keeping ogb's files under ``root``."""
    if name not in OGBL_DATASETS:
        raise InputError(f"unknown OGB link dataset '{name}'; supported: {', '.join(OGBL_DATASETS)}")
    steps = tqdm(total=2, desc=name, unit="step", disable=not progress, leave=False)
    dataset = _open_dataset(name, root)
    with ogb_errors(name, root), unattended_ogb(dataset_dir(name, root), _ogb_module()):
        split = dataset.get_edge_split()
    graph, meta = dataset[0], dataset.meta_info
    num_nodes = int(graph["num_nodes"])
    graph.pop("edge_index", None)   # OGB's train graph again (both ways for collab): rebuilt from the split instead
    positives = {s: _positives(split[s], name, s, num_nodes) for s in SPLITS}
    negatives = {s: _negatives(split[s], name, s, num_nodes) for s in EVAL_SPLITS}
    steps.update()
    undirected = str(meta["add_inverse_edge"]) == "True"
    indptr, indices = to_csr_incoming(positives["train"][0], positives["train"][1], num_nodes,
                                      directed=not undirected)
    x = node_features(graph.get("node_feat"), num_nodes).astype(np.float32, copy=False)
    no_nodes = np.zeros(0, dtype=np.int64)
    result = Graph.homogeneous(indptr=indptr, indices=indices, x=x, y=np.full(num_nodes, -1, dtype=np.int64),
                               splits={s: no_nodes for s in SPLITS}, num_classes=0, directed=not undirected,
                               name=name, source=f"ogb:{name} (v{meta['version']}, {meta['url']})",
                               edge_splits=positives, edge_split_negatives=negatives, link_eval=LINK_EVAL[name])
    result.link_edge_type = result.schema.edge_types[0].key
    result.extra["link_held_out_in_graph"] = held_out_in_graph(result)
    steps.update()
    steps.close()
    return result


def held_out_in_graph(graph: Graph) -> dict[str, int]:
    """Per held-out split, how many positives are edges of the message-passing graph (a repeated pair)."""
    n = graph.num_nodes
    dst = np.repeat(np.arange(n, dtype=np.int64), np.diff(graph.indptr))
    edge_keys = dst * n + graph.indices   # the CSR's (dst, src) order: already sorted
    return {s: int(np.isin(graph.edge_splits[s][1] * n + graph.edge_splits[s][0], edge_keys).sum())
            for s in EVAL_SPLITS}


def _ogb_module() -> Any:
    """``ogb.linkproppred.dataset``, imported late: ogb pulls in pandas and scikit-learn (seconds)."""
    return importlib.import_module("ogb.linkproppred.dataset")


def _open_dataset(name: str, root: str) -> Any:
    """``LinkPropPredDataset(name, root)``, downloading on first use."""
    from ogb.linkproppred import LinkPropPredDataset

    os.makedirs(root, exist_ok=True)
    with ogb_errors(name, root), unattended_ogb(dataset_dir(name, root), _ogb_module()):
        return LinkPropPredDataset(name=name, root=root)


def _positives(part: dict[str, Any], name: str, split: str, num_nodes: int) -> np.ndarray:
    """One split's positives as int64 [2, E] (src, dst): collab's ``edge`` [E, 2], citation2's source/target."""
    if LINK_EVAL[name] == "shared":   # collab: pairs
        pairs = _ids(part, "edge", name, split).reshape(-1, 2).T
    else:
        pairs = np.stack([_ids(part, "source_node", name, split).reshape(-1),
                          _ids(part, "target_node", name, split).reshape(-1)])
    return _in_range(np.ascontiguousarray(pairs), num_nodes, name, split)


def _negatives(part: dict[str, Any], name: str, split: str, num_nodes: int) -> np.ndarray:
    """One split's fixed negatives in ``storage.graph``'s layout: collab's ``edge_neg`` [E_neg, 2] → [2, E_neg];
    citation2's ``target_node_neg`` [E, K] as it is."""
    if LINK_EVAL[name] == "shared":
        neg = np.ascontiguousarray(_ids(part, "edge_neg", name, split).reshape(-1, 2).T)
    else:
        neg = _ids(part, "target_node_neg", name, split)
        if neg.ndim != 2:
            raise InputError(f"{name} split '{split}' target_node_neg has shape {neg.shape}, expected [E, K]; "
                             "delete the dataset directory and rerun to download it again")
    return _in_range(neg, num_nodes, name, split)


def _ids(part: dict[str, Any], key: str, name: str, split: str) -> np.ndarray:
    """``part[key]``, a torch tensor or numpy array of node ids (OGB's split files hold either) → int64 numpy."""
    if key not in part:
        raise InputError(f"{name} split '{split}' has no '{key}' (has {', '.join(part)}); delete the dataset "
                         "directory and rerun to download it again")
    values = part[key]
    arr = values.numpy() if hasattr(values, "numpy") else np.asarray(values)
    if not np.issubdtype(arr.dtype, np.integer):
        raise InputError(f"{name} split '{split}' holds {arr.dtype} node ids; delete the dataset directory and "
                         "rerun to download it again")
    return arr.astype(np.int64, copy=False)


def _in_range(ids: np.ndarray, num_nodes: int, name: str, split: str) -> np.ndarray:
    if ids.size and (ids.min() < 0 or ids.max() >= num_nodes):
        raise InputError(f"{name} split '{split}' has node ids outside [0, {num_nodes}); delete the dataset "
                         "directory and rerun to download it again")
    return ids
