"""``gnnpipe score [KEY] --pairs PAIRS --out OUT``: score node pairs with a link prediction model's published build.

The infer build is the one ``gnnpipe show infer`` would print (``flows.cli_store.find_build``: KEY, the
``--config``/``--set`` given, or the only infer build); its embeddings and its train build's decoder score the pairs
(``stages.infer.score``).

- PAIRS: ``.npy`` of integers shaped [2, E] (row 0 sources, row 1 destinations), or ``.csv`` with two integer
  columns (source, destination), one pair a line, an optional header line; ids are the dataset's own (orig) ids.
- OUT: ``.npy`` (float32 [E], the scores in the pairs' order) or ``.parquet`` (columns src, dst, score), written
  under a temporary name and renamed into place (an existing file is replaced).
"""

from __future__ import annotations

import os
import uuid
import warnings
from pathlib import Path

import numpy as np
import typer

from flows import cli_store
from flows.cli_store import ARTIFACTS, CONFIG, SETS
from storage import InputError
from storage.summaries import InferSummary

PAIR_FORMATS = (".npy", ".csv")
SCORE_FORMATS = (".npy", ".parquet")


def read_pairs(path: Path) -> tuple[np.ndarray, np.ndarray]:
    """``(src, dst)`` int64 from a ``.npy`` [2, E] or a two-column ``.csv``; one InputError line when unreadable."""
    if path.suffix not in PAIR_FORMATS:
        raise InputError(f"--pairs {path}: give a .npy file of shape [2, E] or a .csv of two columns (src,dst)")
    if not path.is_file():
        raise InputError(f"--pairs {path}: no such file")
    pairs = _read_npy(path) if path.suffix == ".npy" else _read_csv(path)
    if pairs.shape[1] == 0:
        raise InputError(f"--pairs {path} holds no pairs")
    return pairs[0].astype(np.int64), pairs[1].astype(np.int64)


def _read_npy(path: Path) -> np.ndarray:
    try:
        pairs = np.load(path, allow_pickle=False)
    except (OSError, ValueError) as err:
        raise InputError(f"--pairs {path} is not a readable .npy file: {err}") from None
    if pairs.ndim != 2 or pairs.shape[0] != 2 or pairs.dtype.kind not in "iu":
        raise InputError(f"--pairs {path} holds {pairs.dtype} of shape {list(pairs.shape)}: give integers of shape "
                         f"[2, E] (row 0 sources, row 1 destinations)")
    return pairs


def _read_csv(path: Path) -> np.ndarray:
    try:
        with open(path, encoding="utf-8") as f:
            header = any(c.isalpha() for c in f.readline())   # "src,dst": a line of names, not of ids
        with warnings.catch_warnings():   # a file without pairs: said below as an error, not as a warning too
            warnings.simplefilter("ignore", UserWarning)
            pairs = np.loadtxt(path, delimiter=",", dtype=np.int64, ndmin=2, skiprows=int(header))
    except (OSError, ValueError) as err:   # ValueError: a bad line, or bytes that are not UTF-8 text
        raise InputError(f"--pairs {path}: {err} (give two integer columns src,dst, an optional header line)") from None
    if pairs.size == 0:
        return np.empty((2, 0), dtype=np.int64)
    if pairs.shape[1] != 2:
        raise InputError(f"--pairs {path} has {pairs.shape[1]} columns: give two, src,dst")
    return pairs.T


def write_scores(path: Path, src: np.ndarray, dst: np.ndarray, scores: np.ndarray) -> None:
    """The scores into ``path`` (.npy or .parquet), through a temporary sibling renamed over it."""
    tmp = path.with_name(f".{path.name}.tmp-{uuid.uuid4().hex[:8]}")
    try:
        if path.suffix == ".npy":
            with open(tmp, "wb") as f:   # np.save(path) would append ".npy" to the temporary name
                np.save(f, scores, allow_pickle=False)
        else:
            import pyarrow as pa
            import pyarrow.parquet as pq

            pq.write_table(pa.table({"src": src, "dst": dst, "score": scores}), tmp)
        os.replace(tmp, path)
    finally:
        tmp.unlink(missing_ok=True)


def _check_out(out: Path) -> None:
    if out.suffix not in SCORE_FORMATS:
        raise InputError(f"--out {out}: give a .npy (the scores) or a .parquet (src, dst, score) file name")
    if out.is_dir():
        raise InputError(f"--out {out} is a directory: give a file name ending in .npy or .parquet")
    if not out.parent.is_dir():
        raise InputError(f"--out {out}: directory {out.parent} does not exist")


def score(key: str | None = typer.Argument(None, metavar="KEY", help="an infer build's key or its first characters "
                                                      "(gnnpipe status)"),
          pairs: Path = typer.Option(..., "--pairs", "-p", help="node pairs in orig ids: .npy [2, E] or .csv "
                                                                "src,dst"),
          out: Path = typer.Option(..., "--out", "-o", help="scores: .npy [E] or .parquet (src, dst, score)"),
          config: Path | None = CONFIG, set_: list[str] = SETS, artifacts: str | None = ARTIFACTS) -> None:
    """Score node pairs with a link prediction model: its decoder on the infer build's node embeddings."""
    # torch is imported only when a command scores (gnnpipe's other commands start without it)
    from stages.infer.score import score_pairs

    _check_out(out)
    src, dst = read_pairs(pairs)
    store, manifest = cli_store.find_build("infer", key, config, set_, artifacts)
    scores = score_pairs(store, manifest, src, dst)
    write_scores(out, src, dst, scores)
    decoder = InferSummary.from_json(manifest.summary).decoder or "?"
    typer.echo(f"scored {scores.shape[0]:,} pairs with infer/{manifest.key} (train/{manifest.upstream['train']}, "
               f"{decoder} decoder) into {out}")


def register(app: typer.Typer) -> None:
    app.command()(score)
