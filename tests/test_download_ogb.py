"""load_ogb on tiny datasets in OGB's on-disk format: the real ``ogb`` parsing and download code runs, then ours."""

from __future__ import annotations

import functools
import http.server
import threading
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest

from stages.download.ogb_source import load_ogb
from storage.errors import InputError
from tests import ogb_fixture
from tests.ogb_fixture import NUM_NODES

# ogb imports torch_geometric, which still calls torch.jit.script.
pytestmark = pytest.mark.filterwarnings("ignore:`torch.jit.script` is deprecated:DeprecationWarning")


def rows(g: object) -> dict[int, list[int]]:
    return {v: g.indices[g.indptr[v]:g.indptr[v + 1]].tolist() for v in range(g.num_nodes)}


def check_nodes(g: object, fx: ogb_fixture.OgbFixture) -> None:
    assert g.num_nodes == NUM_NODES
    assert g.x.dtype == np.float32 and np.array_equal(g.x, fx.x)
    assert g.y.dtype == np.int64 and g.y.tolist() == fx.y.tolist()
    for part in ("train", "valid", "test"):
        assert g.splits[part].dtype == np.int64 and g.splits[part].tolist() == fx.split[part].tolist()


def test_arxiv_is_directed_citations(tmp_path: Path) -> None:
    fx = ogb_fixture.build("ogbn-arxiv", tmp_path)
    g = load_ogb("ogbn-arxiv", str(tmp_path))
    r = rows(g)
    # row v = papers citing v: the chain gives v+1; extras 5->0, 7->0, 3->10; the 2->1 duplicate and 6->6 loop go
    assert r[0] == [1, 5, 7] and r[1] == [2] and r[10] == [3, 11] and r[6] == [7] and r[29] == []
    assert g.num_edges == NUM_NODES - 1 + 3
    assert g.directed and g.num_classes == 40 and g.name == "ogbn-arxiv" and "ogbn-arxiv" in g.source
    check_nodes(g, fx)
    assert (tmp_path / "ogbn_arxiv" / "processed" / "data_processed").exists()  # ogb really parsed the raw files


def test_second_load_reads_ogbs_cache(tmp_path: Path) -> None:
    # ogb reloads processed/data_processed with torch.load, which PyTorch >= 2.6 refuses by default.
    ogb_fixture.build("ogbn-arxiv", tmp_path)
    first = load_ogb("ogbn-arxiv", str(tmp_path))
    (tmp_path / "ogbn_arxiv" / "raw" / "edge.csv.gz").unlink()  # so the second load can only use the cache
    second = load_ogb("ogbn-arxiv", str(tmp_path))
    assert np.array_equal(first.indptr, second.indptr) and np.array_equal(first.indices, second.indices)
    assert np.array_equal(first.x, second.x)


def test_products_is_undirected(tmp_path: Path) -> None:
    fx = ogb_fixture.build("ogbn-products", tmp_path)
    g = load_ogb("ogbn-products", str(tmp_path))
    r = rows(g)
    assert r[0] == [1, 5, 7] and r[1] == [0, 2] and r[10] == [3, 9, 11] and r[6] == [5, 7] and r[29] == [28]
    assert g.num_edges == 2 * (NUM_NODES - 1 + 3)
    assert not g.directed and g.num_classes == 47
    check_nodes(g, fx)


def test_products_edge_features_follow_their_edges(tmp_path: Path) -> None:
    """ogb copies each listed edge's features to its inverse; the canonical graph keeps, for every stored edge, the
    features of the first listed edge joining that pair in that direction (the 2 -> 1 duplicate, edge 32, loses to
    the chain's edge 1) and drops the self-loop's."""
    ogb_fixture.build("ogbn-products", tmp_path, edge_feat=True)
    g = load_ogb("ogbn-products", str(tmp_path))
    assert g.edge_attr is not None and g.edge_attr.shape == (g.num_edges, 2)
    feat = ogb_fixture.edge_features()
    dst = np.repeat(np.arange(g.num_nodes), np.diff(g.indptr))
    first: dict[tuple[int, int], int] = {}
    for i, (u, v) in enumerate(ogb_fixture.EDGES.T.tolist()):
        first.setdefault((u, v), i)
    for i, (u, v) in enumerate(ogb_fixture.EDGES.T.tolist()):
        first.setdefault((v, u), i)   # ogb's inverse edges come after all listed ones
    for u, v, attr in zip(g.indices.tolist(), dst.tolist(), g.edge_attr):
        assert attr.tolist() == feat[first[(u, v)]].tolist()


def test_papers100m_binary_format_with_missing_labels(tmp_path: Path) -> None:
    fx = ogb_fixture.build("ogbn-papers100M", tmp_path)
    g = load_ogb("ogbn-papers100M", str(tmp_path))
    assert rows(g)[0] == [1, 5, 7] and g.directed and g.num_classes == 172
    assert g.y[3] == -1 and g.y[28] == -1 and g.y[4] == 4  # NaN labels -> -1
    check_nodes(g, fx)


@pytest.fixture
def http_dir(tmp_path: Path) -> Iterator[tuple[Path, str]]:
    """A directory served on 127.0.0.1 (ogb's downloader speaks plain HTTP to OGB's server)."""
    serve = tmp_path / "www"
    serve.mkdir()
    handler = functools.partial(_QuietHandler, directory=str(serve))
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    thread = threading.Thread(target=server.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True)
    thread.start()
    try:
        yield serve, f"http://127.0.0.1:{server.server_address[1]}"
    finally:
        server.shutdown()
        server.server_close()


class _QuietHandler(http.server.SimpleHTTPRequestHandler):
    def log_message(self, *args: object) -> None:
        pass


def redirect_downloads(monkeypatch: pytest.MonkeyPatch, base_url: str) -> list[str]:
    """Make ogb fetch ``<base_url>/<file>`` instead of snap.stanford.edu; ogb's own download_url still runs."""
    import ogb.nodeproppred.dataset as ogb_dataset

    real = ogb_dataset.download_url
    requested: list[str] = []

    def download_url(url: str, folder: str, log: bool = True) -> str:
        requested.append(url)
        return real(f"{base_url}/{url.rpartition('/')[2]}", folder, log)

    monkeypatch.setattr(ogb_dataset, "download_url", download_url)
    return requested


def test_download_and_extract_over_http(tmp_path: Path, http_dir: tuple[Path, str],
                                        monkeypatch: pytest.MonkeyPatch) -> None:
    serve, url = http_dir
    ogb_fixture.build_zip("ogbn-arxiv", serve)
    requested = redirect_downloads(monkeypatch, url)
    root = tmp_path / "cache"
    g = load_ogb("ogbn-arxiv", str(root))  # no stdin prompt: stdin is not readable under pytest
    assert requested == ["http://snap.stanford.edu/ogb/data/nodeproppred/arxiv.zip"]
    assert rows(g)[0] == [1, 5, 7] and g.directed
    check_nodes(g, ogb_fixture.OgbFixture("ogbn-arxiv", root, ogb_fixture.EDGES, ogb_fixture.features(),
                                          ogb_fixture.labels("ogbn-arxiv"), ogb_fixture.SPLIT))
    assert (root / "ogbn_arxiv" / "RELEASE_v1.txt").exists()
    assert not (root / "arxiv.zip").exists() and not (root / "arxiv").exists()  # ogb cleaned up


def test_corrupt_download_is_an_input_error(tmp_path: Path, http_dir: tuple[Path, str],
                                            monkeypatch: pytest.MonkeyPatch) -> None:
    serve, url = http_dir
    (serve / "arxiv.zip").write_bytes(b"<html>not a zip</html>")
    redirect_downloads(monkeypatch, url)
    with pytest.raises(InputError, match="archive in .* is corrupt .*delete the .zip file there and rerun"):
        load_ogb("ogbn-arxiv", str(tmp_path / "cache"))


def test_unreachable_server_is_an_input_error(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    redirect_downloads(monkeypatch, "http://127.0.0.1:9")  # discard port: connection refused
    with pytest.raises(InputError, match="could not download ogbn-arxiv .*check the network, or put the extracted"):
        load_ogb("ogbn-arxiv", str(tmp_path / "cache"))


@pytest.mark.parametrize("release", [None, "RELEASE_v0.txt"], ids=["interrupted copy", "older release"])
def test_incomplete_directory_fails_instead_of_prompting(tmp_path: Path, release: str | None) -> None:
    (tmp_path / "ogbn_products" / "raw").mkdir(parents=True)
    if release:
        (tmp_path / "ogbn_products" / release).write_text("")
    with pytest.raises(InputError, match=r"ogbn_products is an incomplete or outdated OGB download .*delete it"):
        load_ogb("ogbn-products", str(tmp_path))


def test_missing_raw_file_is_an_input_error(tmp_path: Path) -> None:
    ogb_fixture.build("ogbn-arxiv", tmp_path)
    (tmp_path / "ogbn_arxiv" / "raw" / "node_year.csv.gz").unlink()
    with pytest.raises(InputError, match="could not load ogbn-arxiv from .*delete that directory and rerun"):
        load_ogb("ogbn-arxiv", str(tmp_path))


def test_unknown_name_lists_supported(tmp_path: Path) -> None:
    with pytest.raises(InputError, match="unknown OGB dataset 'ogbn-proteins'; supported: ogbn-arxiv, "
                                         "ogbn-products, ogbn-papers100M, ogbn-mag"):
        load_ogb("ogbn-proteins", str(tmp_path))


def test_ogb_module_is_restored(tmp_path: Path) -> None:
    import ogb.nodeproppred.dataset as ogb_dataset

    before = ogb_dataset.decide_download, ogb_dataset.torch
    ogb_fixture.build("ogbn-arxiv", tmp_path)
    load_ogb("ogbn-arxiv", str(tmp_path))
    assert (ogb_dataset.decide_download, ogb_dataset.torch) == before
    assert "input" not in vars(ogb_dataset)  # the builtin is visible there again


def typed_edges(g: object, key: str) -> set[tuple[int, int]]:
    """Edge type ``key``'s edges in per-type ids, read back from the graph's one incoming CSR."""
    schema = g.schema
    e = next(i for i, t in enumerate(schema.edge_types) if t.key == key)
    et = schema.edge_types[e]
    offsets = schema.orig_offsets()
    src_base, dst_base = (int(offsets[schema.type_id(t)]) for t in (et.src, et.dst))
    r = schema.num_edge_types
    out = set()
    for v in range(g.num_nodes):
        for u in g.indices[g.indptr[v * r + e]:g.indptr[v * r + e + 1]].tolist():
            out.add((u - src_base, v - dst_base))
    return out


@pytest.mark.parametrize("add_reverse", [True, False])
def test_mag_goes_through_ogbs_heterogeneous_reader_to_a_typed_graph(tmp_path: Path, add_reverse: bool) -> None:
    from tests import ogb_mag_fixture as mag

    mag.build(tmp_path)
    g = load_ogb("ogbn-mag", str(tmp_path), add_reverse=add_reverse)
    schema = g.schema
    assert [(t.name, t.num_nodes, t.num_features, t.num_classes) for t in schema.node_types] == [
        ("author", 8, None, 0), ("field_of_study", 4, None, 0), ("institution", 3, None, 0), ("paper", 12, 3, 349)]
    assert g.name == "ogbn-mag" and "ogbn-mag" in g.source and g.directed == (not add_reverse)
    for (src, rel, dst), edges in mag.EDGES.items():   # every typed edge exactly, in per-type ids
        pairs = set(zip(edges[0].tolist(), edges[1].tolist()))
        if add_reverse and src == dst:                  # paper cites paper: symmetrised in place
            pairs |= {(d, s) for s, d in pairs}
        assert typed_edges(g, f"{src}___{rel}___{dst}") == pairs
        if add_reverse and src != dst:
            assert typed_edges(g, f"{dst}___rev_{rel}___{src}") == {(d, s) for s, d in pairs}
    assert schema.num_edge_types == (7 if add_reverse else 4)
    paper = int(schema.orig_offsets()[schema.type_id("paper")])
    assert np.array_equal(g.features["paper"], mag.paper_features()) and set(g.features) == {"paper"}
    assert g.y[:paper].tolist() == [-1] * paper and g.y[paper:].tolist() == mag.paper_labels().tolist()
    for name, idx in mag.SPLIT.items():
        assert g.splits[name].tolist() == (idx + paper).tolist()
    assert (tmp_path / "ogbn_mag" / "processed" / "data_processed").exists()   # ogb parsed the raw files


def test_the_mag_key_has_add_reverse_and_the_homogeneous_ones_do_not() -> None:
    from stages.download.stage import Params

    assert Params(dataset="ogbn-mag", add_reverse=False).key_params() == {"dataset": "ogbn-mag", "add_reverse": False}
    assert Params(dataset="ogbn-arxiv", add_reverse=False).key_params() == {"dataset": "ogbn-arxiv"}
