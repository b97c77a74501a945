"""A typed graph from the user's own files (``stages.download.typed_files``): the documented layout reads to the
very graph ogb's reader makes of the same data, and each problem is one line naming its file."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from stages.download.ogb_source import load_ogb
from stages.download.stage import Params, load
from stages.download.typed_files import load_typed_files
from storage.errors import InputError
from tests import ogb_mag_fixture as mag

pytestmark = pytest.mark.filterwarnings("ignore:`torch.jit.script` is deprecated:DeprecationWarning")


def write_mag_files(d: Path) -> Path:
    """The MAG fixture in the typed files layout (README: your own typed graph)."""
    d.mkdir(parents=True, exist_ok=True)
    (d / "schema.json").write_text(json.dumps({"node_types": mag.NUM_NODES, "num_classes": {"paper": 349},
                                               "name": "tiny-mag"}))
    paper = d / "nodes" / "paper"
    paper.mkdir(parents=True)
    np.save(paper / "x.npy", mag.paper_features())
    np.save(paper / "y.npy", mag.paper_labels())
    for split, idx in mag.SPLIT.items():
        np.save(paper / f"{split}_idx.npy", idx)
    for (src, rel, dst), edges in mag.EDGES.items():
        folder = d / "edges" / f"{src}___{rel}___{dst}"
        folder.mkdir(parents=True)
        np.save(folder / "edge_index.npy", edges)
    return d


@pytest.mark.parametrize("add_reverse", [True, False])
def test_typed_files_read_to_the_graph_ogbs_reader_makes(tmp_path: Path, add_reverse: bool):
    mag.build(tmp_path / "ogb")
    want = load_ogb("ogbn-mag", str(tmp_path / "ogb"), add_reverse=add_reverse)
    got = load_typed_files(str(write_mag_files(tmp_path / "files")), add_reverse=add_reverse)
    assert [(t.name, t.num_nodes, t.num_features) for t in got.schema.node_types] == \
        [(t.name, t.num_nodes, t.num_features) for t in want.schema.node_types]
    assert got.schema.edge_types == want.schema.edge_types and got.name == "tiny-mag"
    np.testing.assert_array_equal(got.indptr, want.indptr)
    np.testing.assert_array_equal(got.indices, want.indices)
    np.testing.assert_array_equal(got.y, want.y)
    np.testing.assert_array_equal(got.features["paper"], want.features["paper"])
    for split in ("train", "valid", "test"):
        np.testing.assert_array_equal(got.splits[split], want.splits[split])


def test_the_stage_reads_a_typed_directory_and_keys_add_reverse(tmp_path: Path):
    d = write_mag_files(tmp_path)
    params = Params(dataset="files", path=str(d), add_reverse=False)
    assert params.key_params()["add_reverse"] is False
    graph = load(params, download_dir=str(tmp_path / "unused"), progress=False)
    assert graph.schema.num_edge_types == 4 and graph.directed


def _break(d: Path, what: str) -> None:
    paper = d / "nodes" / "paper"
    if what == "x rows":
        np.save(paper / "x.npy", mag.paper_features()[:5])
    elif what == "schema key":
        (d / "schema.json").write_text(json.dumps({"node_types": mag.NUM_NODES, "classes": {"paper": 3}}))
    elif what == "no classes":
        (d / "schema.json").write_text(json.dumps({"node_types": mag.NUM_NODES}))
    elif what == "edge ids":
        np.save(d / "edges" / "author___writes___paper" / "edge_index.npy", np.array([[0, 99], [0, 1]]))
    elif what == "edge folder":
        (d / "edges" / "author_writes_paper").mkdir()
    elif what == "split overlap":
        np.save(paper / "valid_idx.npy", np.array([0, 8]))
    elif what == "unknown type":
        folder = d / "edges" / "venue___hosts___paper"
        folder.mkdir()
        np.save(folder / "edge_index.npy", np.array([[0], [0]]))


@pytest.mark.parametrize("what, message", [
    ("x rows", r"nodes/paper: x.npy has 5 rows but schema.json gives the type 12 nodes"),
    ("schema key", r"schema.json must be an object .* \(unknown key\(s\): classes\)"),
    ("no classes", r"schema.json gives no num_classes: name the labelled node type"),
    ("edge ids", r"edges/author___writes___paper: edge_index.npy row 0 \(author\) has node ids in \[0, 99\]"),
    ("edge folder", r"edges/author_writes_paper: an edge type folder is named <src>___<rel>___<dst>"),
    ("split overlap", r"nodes/paper: train_idx.npy and valid_idx.npy share 1 node\(s\)"),
    ("unknown type", r"edges/venue___hosts___paper: node type venue is not in schema.json's node_types"),
])
def test_a_bad_typed_directory_is_one_line_naming_the_file(tmp_path: Path, what: str, message: str):
    d = write_mag_files(tmp_path)
    _break(d, what)
    with pytest.raises(InputError, match=message) as err:
        load_typed_files(str(d), add_reverse=True)
    assert "\n" not in str(err.value)
