"""load_files: a user's .npy directory → Graph, and one readable error per kind of broken input."""

from __future__ import annotations

import logging
from collections.abc import Callable
from pathlib import Path

import numpy as np
import pytest

from stages.download.files_source import load_files
from storage.errors import InputError
from tests._download_cases import EDGES, SPLIT, X, Y, write_dataset


def rows(g: object) -> list[list[int]]:
    return [g.indices[g.indptr[v]:g.indptr[v + 1]].tolist() for v in range(g.num_nodes)]


def test_edge_index_directory_round_trip(tmp_path: Path) -> None:
    g = load_files(str(write_dataset(tmp_path / "mygraph")))
    # undirected by default: symmetrised, duplicate and self-loop dropped
    assert rows(g) == [[1, 2], [0, 2], [0, 1], [4], [3], []]
    assert g.x.dtype == np.float16 and np.array_equal(g.x, X)  # dtype kept
    assert g.y.dtype == np.int64 and g.y.tolist() == Y.tolist()
    assert {k: v.tolist() for k, v in g.splits.items()} == {k: v.tolist() for k, v in SPLIT.items()}
    assert all(v.dtype == np.int64 for v in g.splits.values())
    assert g.num_classes == 3 and not g.directed and g.name == "mygraph"
    assert g.source.startswith("files(") and str(tmp_path / "mygraph") in g.source


def test_csr_directory_directed_with_meta(tmp_path: Path) -> None:
    meta = {"directed": True, "num_classes": 5, "name": "citations"}
    g = load_files(str(write_dataset(tmp_path / "d", csr=True, meta=meta)))
    assert rows(g) == [[2], [0], [1], [], [3], []]  # orientation kept: 0->1 is in row 1
    assert g.directed and g.num_classes == 5 and g.name == "citations"


def test_csr_and_edge_index_forms_agree_when_undirected(tmp_path: Path) -> None:
    a = load_files(str(write_dataset(tmp_path / "a")))
    b = load_files(str(write_dataset(tmp_path / "b", csr=True)))
    assert np.array_equal(a.indptr, b.indptr) and np.array_equal(a.indices, b.indices)


def test_ogb_style_label_column_is_accepted(tmp_path: Path) -> None:
    d = write_dataset(tmp_path / "d")
    np.save(d / "y.npy", Y.reshape(-1, 1))
    assert load_files(str(d)).y.tolist() == Y.tolist()


def save(name: str, value: object) -> Callable[[Path], None]:
    return lambda d: np.save(d / name, value)


def remove(name: str) -> Callable[[Path], None]:
    return lambda d: (d / name).unlink()


def write_text(name: str, text: str) -> Callable[[Path], None]:
    return lambda d: (d / name).write_text(text)


def truncate(name: str) -> Callable[[Path], None]:
    def f(d: Path) -> None:
        data = (d / name).read_bytes()
        (d / name).write_bytes(data[: len(data) - 8])
    return f


def save_npz_as(name: str) -> Callable[[Path], None]:
    def f(d: Path) -> None:
        with open(d / name, "wb") as fh:
            np.savez(fh, a=np.arange(3))
    return f


def save_pickled(name: str) -> Callable[[Path], None]:
    return lambda d: np.save(d / name, np.array([[0, 1], [1, 0]], dtype=object), allow_pickle=True)


BROKEN = {
    "missing x": (remove("x.npy"), "x.npy is missing in"),
    "missing y": (remove("y.npy"), "y.npy is missing in"),
    "missing valid split": (remove("valid_idx.npy"), "valid_idx.npy is missing in"),
    "both topologies": (save("indptr.npy", np.array([0, 0, 0, 0, 0, 0, 0])), "has both edge_index.npy and"),
    "no topology": (remove("edge_index.npy"), "has no topology; add edge_index.npy"),
    "indptr without indices": (lambda d: (remove("edge_index.npy")(d), save("indptr.npy", np.zeros(7, int))(d)),
                               "indices.npy is missing in"),
    "edge_index [E, 2]": (save("edge_index.npy", EDGES.T), r"shape \(6, 2\); it must be \[2, E\]"),
    "edge_index floats": (save("edge_index.npy", EDGES.astype(float)), "edge_index.npy has dtype float64"),
    "edge id out of range": (save("edge_index.npy", np.array([[0], [6]])),
                             r"edge_index.npy has node ids in \[0, 6\] but there are 6 nodes"),
    "negative edge id": (save("edge_index.npy", np.array([[-1], [2]])), r"node ids in \[-1, 2\]"),
    "x 1-D": (save("x.npy", np.zeros(6)), r"x.npy has shape \(6,\).*numeric \[N, F\]"),
    "x strings": (save("x.npy", np.array([["a"]] * 6)), "x.npy has shape .* and dtype <U1"),
    "x pickled objects": (save_pickled("x.npy"), "x.npy in .* is not a readable .npy array"),
    "x truncated": (truncate("x.npy"), "x.npy in .* is not a readable .npy array"),
    "x complex": (save("x.npy", X.astype(complex)), r"x.npy has shape \(6, 2\) and dtype complex128; it must be a "
                                                   "numeric .* of bool, integers, float16, float32 or float64"),
    "x bfloat16 saved by numpy": (save("x.npy", np.zeros((6, 2), dtype="V2")),
                                  r"dtype \|V2, which is how numpy saves a bfloat16 .* save x as float16 or float32"),
    "x NaN": (save("x.npy", np.where(np.arange(12).reshape(6, 2) == 9, np.nan, X)),
              r"^x.npy in .* has NaN at row 4, column 1 \(the first non-finite value\); features must be finite"),
    "x Inf": (save("x.npy", np.where(np.arange(12).reshape(6, 2) >= 5, np.inf, X).astype(np.float16)),
              r"^x.npy in .* has Inf at row 2, column 1 \(the first non-finite value\)"),
    "y truncated": (truncate("y.npy"), "y.npy in .* is not a readable .npy array"),
    "npz renamed to npy": (save_npz_as("y.npy"), "y.npy in .* is not a single .npy array"),
    "y too short": (save("y.npy", Y[:5]), "y.npy has 5 labels but the graph has 6 nodes"),
    "y floats": (save("y.npy", Y.astype(float)), "y.npy has shape .* dtype float64; it must be a 1-D integer"),
    "y below -1": (save("y.npy", np.array([0, 1, 2, 1, 0, -2])), "y.npy has label -2"),
    "y all unlabelled": (save("y.npy", -np.ones(6, int)), "y.npy has no labelled node"),
    "label >= num_classes": (write_text("meta.json", '{"num_classes": 2}'),
                             "y.npy has label 2 but meta.json says num_classes=2"),
    "split out of range": (save("test_idx.npy", np.array([4, 9])), r"test_idx.npy has node ids in \[4, 9\]"),
    "split floats": (save("valid_idx.npy", np.array([3.0])), "valid_idx.npy has shape .* dtype float64"),
    "split 2-D": (save("valid_idx.npy", np.array([[3]])), r"valid_idx.npy has shape \(1, 1\)"),
    "overlapping splits": (save("test_idx.npy", np.array([4, 2])),
                           r"train_idx.npy and test_idx.npy share 1 node\(s\) .*node 2.*disjoint"),
    "repeated split id": (save("valid_idx.npy", np.array([3, 3])), "valid_idx.npy lists some node more than once"),
    "empty train": (save("train_idx.npy", np.array([], dtype=np.int64)), "train_idx.npy is empty"),
    "unlabelled in split": (save("test_idx.npy", np.array([4, 5])), r"test_idx.npy has 1 node\(s\) labelled -1"),
    "meta not json": (write_text("meta.json", "{directed: true"), "meta.json in .* is not valid JSON"),
    "meta not object": (write_text("meta.json", "[1]"), "meta.json in .* must be a JSON object"),
    "meta unknown key": (write_text("meta.json", '{"directd": true}'), "meta.json has unknown key 'directd'"),
    "meta wrong type": (write_text("meta.json", '{"directed": "yes"}'),
                        "meta.json key 'directed' is 'yes'; it must be a JSON true/false"),
    "meta bool num_classes": (write_text("meta.json", '{"num_classes": true}'),
                              "key 'num_classes' is True; it must be a JSON integer"),
}

BROKEN_CSR = {
    "indptr length": (save("indptr.npy", np.array([0, 1, 2, 3, 4])), "indptr.npy describes 4 nodes but x.npy has 6"),
    "indptr end": (save("indptr.npy", np.array([0, 1, 2, 3, 3, 4, 5])),
                   "indptr.npy runs from 0 to 5; it must run from 0 to len"),
    "indptr start": (save("indptr.npy", np.array([1, 1, 2, 3, 3, 4, 4])), "indptr.npy runs from 1 to 4"),
    "indptr decreasing": (save("indptr.npy", np.array([0, 2, 1, 3, 3, 4, 4])), "indptr.npy decreases somewhere"),
    "indices floats": (save("indices.npy", np.array([2.0, 0, 1, 3])), "indices.npy has shape .* dtype float64"),
    "indices out of range": (save("indices.npy", np.array([2, 0, 1, 7])), r"indices.npy has node ids in \[0, 7\]"),
}


@pytest.mark.parametrize("case", list(BROKEN), ids=list(BROKEN))
def test_broken_edge_index_dataset(tmp_path: Path, case: str) -> None:
    breakage, match = BROKEN[case]
    d = write_dataset(tmp_path / "d")
    breakage(d)
    with pytest.raises(InputError, match=match) as err:
        load_files(str(d))
    assert "\n" not in str(err.value)


@pytest.mark.parametrize("case", list(BROKEN_CSR), ids=list(BROKEN_CSR))
def test_broken_csr_dataset(tmp_path: Path, case: str) -> None:
    breakage, match = BROKEN_CSR[case]
    d = write_dataset(tmp_path / "d", csr=True)
    breakage(d)
    with pytest.raises(InputError, match=match) as err:
        load_files(str(d))
    assert "\n" not in str(err.value)


def test_missing_directory(tmp_path: Path) -> None:
    with pytest.raises(InputError, match="does not exist; pass the directory holding edge_index.npy"):
        load_files(str(tmp_path / "nope"))


STRAY = ("warning: y.npy: classes 3-9 have no labelled node; num_classes=11 because the largest label is 10 (fix a "
         "stray label, or set num_classes in meta.json to keep empty classes)")


def test_a_stray_label_warns_of_the_classes_it_leaves_empty(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    """Label 10 among 0-2 makes 11 classes (as documented); one line says which are empty, and why."""
    d = write_dataset(tmp_path / "d")
    np.save(d / "y.npy", np.array([0, 1, 2, 1, 0, 10]))
    with caplog.at_level(logging.INFO, logger="gnnpipe.download"):
        g = load_files(str(d))
    assert g.num_classes == 11
    assert [r.getMessage() for r in caplog.records if "labelled node" in r.getMessage()] == [STRAY]
    caplog.clear()
    with caplog.at_level(logging.INFO, logger="gnnpipe.download"):
        load_files(str(write_dataset(tmp_path / "dense")))   # classes 0-2 all present
        load_files(str(write_dataset(tmp_path / "meant", meta={"num_classes": 11})))   # said on purpose
    assert not [r for r in caplog.records if "labelled node" in r.getMessage()]
