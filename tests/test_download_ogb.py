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
    with pytest.raises(InputError, match="unknown OGB dataset 'ogbn-mag'; supported: ogbn-arxiv, ogbn-products, "
                                         "ogbn-papers100M"):
        load_ogb("ogbn-mag", str(tmp_path))


def test_ogb_module_is_restored(tmp_path: Path) -> None:
    import ogb.nodeproppred.dataset as ogb_dataset

    before = ogb_dataset.decide_download, ogb_dataset.torch
    ogb_fixture.build("ogbn-arxiv", tmp_path)
    load_ogb("ogbn-arxiv", str(tmp_path))
    assert (ogb_dataset.decide_download, ogb_dataset.torch) == before
    assert "input" not in vars(ogb_dataset)  # the builtin is visible there again
