"""Inference of a link prediction model (train's ``task=link``): every node's embedding, no classes.

The train artifact's ``model.pt`` is a ``LinkModel``'s state (``stages.train.tasks.link``): ``encoder.*``, a node
model whose output layer is ``hidden`` wide, and ``decoder.*``, the pair scorer. Inference builds the encoder as
the trainer built it and runs it layer by layer over every node as it runs a node classifier
(``stages.infer.layerwise``); its outputs are the embeddings (``storage.infer``: ``emb/out``), which the decoder
scores pairs from (``stages.infer.score``). There are no labels to predict, so no pred, prob or accuracy.

Torch-free at import: the stage reads the manifests and writes the metrics, report and summary from here.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from storage import Manifest
from storage.infer import LINK_EMBEDDINGS, METRICS, NODES
from storage.report import Report, markdown_table
from storage.summaries import InferSummary
from storage.train_summary import TrainSummary

ENCODER = "encoder."   # LinkModel's submodules: model.pt's key prefixes
DECODER = "decoder."


def submodule_state(state: Mapping[str, Any], prefix: str) -> dict[str, Any]:
    """The entries of ``state`` under ``prefix``, the prefix stripped: one submodule's ``state_dict``."""
    return {k[len(prefix):]: v for k, v in state.items() if k.startswith(prefix)}


def link_metrics(common: dict[str, Any], ranks: list[dict[str, Any]], trained: Manifest) -> dict[str, Any]:
    """The stage's metrics for a link model: ``common`` (the figures every infer build has) and what the
    embeddings are."""
    summary = TrainSummary.from_json(trained.summary)
    return {**common, "task": "link", "decoder": trained.params.get("decoder", summary.model.get("decoder")),
            "embedding_width": int(ranks[0]["embedding_width"]), "embeddings_at": LINK_EMBEDDINGS,
            "train_test_metrics": summary.test_metrics}


def link_summary(m: dict[str, Any], ranks: list[dict[str, Any]]) -> dict[str, Any]:
    """The manifest's summary of a link build (``ranks``: as a node build's summary lists them)."""
    keys = ("mode", "fanouts", "path", "num_nodes", "num_partitions", "num_layers", "embedding_layers", "embeddings",
            "task", "decoder", "embedding_width", "embeddings_at", "train_test_metrics", "train_key", "scalars",
            "exported_nodes", "node_types", "link_metrics")
    return {**{k: m.get(k) for k in keys}, "ranks": ranks,
            "files": {"nodes": NODES, "embeddings": LINK_EMBEDDINGS, "metrics": METRICS}}


def _value(v: Any) -> Any:
    return "n/a" if v is None else round(float(v), 4)


def _figure(name: str, v: Any) -> str:
    return f"{name} {'n/a' if v is None else f'{float(v):.4f}'}"


def link_report(uri: str, key: str, s: InferSummary, ranks_table: list[dict[str, Any]]) -> Report:
    how = "exact" if s.mode == "exact" else f"sampled ({','.join(map(str, s.fanouts or []))})"
    peak = max((r["peak_rss_mib"] for r in s.ranks), default=0.0)
    where = f"{uri}/{s.embeddings_at}"
    sampled = s.train_test_metrics or {}
    lm = s.link_metrics or {}
    head = lm.get("headline", "mrr")
    train_fig = (f"the train stage's sampled test MRR {sampled['mrr']:.4f}" if sampled.get("mrr") is not None
                 else "")
    if lm:
        exact = f"test {_figure(head.replace('hits', 'Hits').replace('mrr', 'MRR'), lm['test'].get(head))}"
        figures = f": {exact} from {how} embeddings{f' ({train_fig})' if train_fig else ''}"
    else:
        figures = f" ({train_fig})" if train_fig else ""
    headline = (f"{how} link prediction embeddings of {s.num_nodes:,} nodes ({s.embedding_width} wide) on "
                f"{s.num_partitions} rank(s){figures} | {s.wall_s:.1f} s, peak RSS {peak:.0f} MiB/rank | "
                f"embeddings: {where}")
    names = sorted({n for sp in ("valid", "test") for n in lm.get(sp, {}) if n not in ("positives", "negatives")}
                   | set(sampled))
    table = [{"metric": n, "valid (exact)": _value(lm.get("valid", {}).get(n)),
              "test (exact)": _value(lm.get("test", {}).get(n)),
              "test (train stage, sampled)": _value(sampled.get(n))} for n in names]
    hidden = (f" Hidden layer(s) {', '.join(map(str, s.embedding_layers))} too, in `{NODES}/emb/layer-<l>`."
              if s.embedding_layers else "")
    how_measured = (f"From the {how} embeddings and the trained decoder, every valid and test positive of the "
                    f"edge split: {lm['protocol']} ({lm['valid']['positives']:,} / {lm['test']['positives']:,} "
                    f"positives, {lm['test']['negatives']:,} test negatives, {lm['seconds']:.1f} s). The train "
                    f"stage's figure ranks a sample of positives against negatives shared by a batch, on sampled "
                    f"neighbourhoods.\n\n" if lm else "")
    metrics = f"### Link metrics\n\n{how_measured}{markdown_table(table)}\n\n" if table else ""
    md = (f"## infer `{key}`\n\n{headline}\n\nLink prediction model of train `{s.train_key}`: its encoder "
          f"({s.num_layers} layers, computed {s.path}) gives every node's embedding, in orig-id order in "
          f"`{where}` (row i = orig id i; per partition: `part-<p>.zarr/emb/out`, with `orig_id`).{hidden} Pairs "
          f"are scored by the train artifact's `{s.decoder}` decoder: `gnnpipe score {key[:8]} --pairs "
          f"PAIRS.npy --out scores.parquet`. No classes: no predictions or accuracy.\n\n"
          f"{metrics}### Ranks\n\n{markdown_table(ranks_table)}\n")
    return Report(headline, table, md)
