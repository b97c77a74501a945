"""Scores of node pairs from a link prediction model's published outputs: the infer artifact's node embeddings
(``storage.infer``: ``emb/out``, row i = orig id i) and the train artifact's decoder (``model.pt``'s ``decoder.*``),
as the train stage scores a pair: ``decoder(h_src, h_dst)`` (``stages.train.tasks.link.LinkModel``), here in eval
mode (no dropout) and float32 (a bfloat16-trained model autocast its products; the weights are float32).

A score is the decoder's logit: with the built-in ``bce`` loss, ``sigmoid(score)`` is the modelled probability of
the edge ``src -> dst``. Pairs are in the dataset's own (orig) ids; on a typed graph those number the node types one
after another (``storage.schema.GraphSchema.orig_offsets``). Memory: ``PIECE_PAIRS`` pairs at a time, of which only
the distinct ends' embedding rows are read (never the whole N x D matrix).
"""

from __future__ import annotations

import io
from collections.abc import Callable

import numpy as np
import torch

from stages.infer.link import DECODER, submodule_state
from stages.infer.params import train_params
from stages.infer.tasks import build_task, infer_task
from storage import ArtifactStore, InputError, Manifest
from storage.infer_artifact import InferArtifact
from storage.manifest import builds_apart
from storage.train import MODEL, split_model_state

PIECE_PAIRS = 1 << 16   # pairs scored at a time: 2 x 65 536 rows of D floats at most (64 MiB at D = 256)

RowsOf = Callable[[np.ndarray], np.ndarray]   # sorted distinct orig ids -> their embedding rows


def load_decoder(store: ArtifactStore, train: Manifest) -> torch.nn.Module:
    """The train artifact's decoder with its trained weights, in eval mode, built as the trainer built it."""
    from stages.train.models.plugins import make_decoder

    params = train_params(train)
    if "decoder_code" in train.params:   # a plug-in decoder: scores need the code it was trained with
        from stages.train.models.plugin_code import source_digest

        if source_digest(params.decoder) != train.params["decoder_code"]:
            raise InputError(f"the code of decoder {params.decoder} changed since train/{train.key} was trained: "
                             f"rerun the pipeline (which retrains it) before scoring")
    decoder = make_decoder(params.decoder, params.hidden, params.dropout)
    state, _ = split_model_state(torch.load(io.BytesIO(store.read_bytes("train", train.key, MODEL)),
                                            map_location="cpu", weights_only=True))
    decoder.load_state_dict(submodule_state(state, DECODER))
    return decoder.eval()


def check_pairs(src: np.ndarray, dst: np.ndarray, num_nodes: int) -> None:
    """Integer ids of equal count, each in ``[0, num_nodes)``; else one InputError line."""
    if src.ndim != 1 or src.shape != dst.shape:
        raise InputError(f"pairs need as many sources as destinations (got shapes {src.shape} and {dst.shape})")
    if src.dtype.kind not in "iu" or dst.dtype.kind not in "iu":
        raise InputError(f"pair ids must be integers (node ids), not {src.dtype}/{dst.dtype}")
    for name, ids in (("source", src), ("destination", dst)):
        bad = np.flatnonzero((ids < 0) | (ids >= num_nodes))
        if bad.size:
            raise InputError(f"pair {int(bad[0])}: {name} id {int(ids[bad[0]])} is not a node id of the graph "
                             f"(0 to {num_nodes - 1}); {bad.size:,} pair(s) out of range")


def pair_scores(rows_of: RowsOf, decoder: torch.nn.Module, src: np.ndarray, dst: np.ndarray,
                piece: int = PIECE_PAIRS) -> np.ndarray:
    """float32 [E]: ``decoder(emb[src[i]], emb[dst[i]])`` of every pair, ``piece`` pairs at a time."""
    out = np.empty(src.shape[0], dtype=np.float32)
    for a in range(0, src.shape[0], piece):
        b = min(a + piece, src.shape[0])
        ends, at = np.unique(np.concatenate([src[a:b], dst[a:b]]), return_inverse=True)
        h = torch.from_numpy(np.asarray(rows_of(ends), dtype=np.float32)).index_select(0, torch.from_numpy(at))
        with torch.inference_mode():
            out[a:b] = decoder(h[:b - a], h[b - a:]).to(torch.float32).numpy()
    return out


def link_build(store: ArtifactStore, infer: Manifest) -> tuple[InferArtifact, Manifest]:
    """The infer build's artifact and its train manifest, when they hold a link prediction model."""
    train = store.load("train", infer.upstream["train"])
    if changed := builds_apart(infer, train):   # a model retrained on a GPU since: not the embeddings' model
        raise InputError(f"infer/{infer.key} was made from another build of {', '.join(changed)} than train/"
                         f"{train.key} holds now: rerun the pipeline (it redoes the inference), then score")
    art = InferArtifact(store, infer)
    if not (build_task(art.summary).scores_pairs and infer_task(train).scores_pairs):
        raise InputError(f"infer/{infer.key} holds a node classifier's predictions (train/{train.key} has "
                         f"task=node): pairs are scored with a link prediction model (train.task=link)")
    return art, train


def score_pairs(store: ArtifactStore, infer: Manifest, src: np.ndarray, dst: np.ndarray) -> np.ndarray:
    """float32 [E]: the scores of the pairs ``(src[i], dst[i])`` (orig ids) by the link model of build ``infer``."""
    art, train = link_build(store, infer)
    src, dst = np.asarray(src), np.asarray(dst)
    check_pairs(src, dst, art.num_nodes)
    return pair_scores(art.embedding_rows, load_decoder(store, train), src.astype(np.int64), dst.astype(np.int64))
