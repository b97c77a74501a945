"""The partition stage's parallel unit: write the ``part-<p>.zarr`` stores of a group of parts, wherever
``stages.executor`` runs it (issue [3/5]: "the per-part CSR and map writes").

Only the part writes spread out. The assignment (METIS, KaMinPar or random) is one process, the stage's, which then
writes the book into the build's work directory; on Dask every unit (:func:`write_parts` of a :class:`PartsJob`)
gets small values only (the root's URL, the download manifest, the work directory, its parts), re-opens the store,
reads the book back from the work directory, memory-maps the download graph into its own scratch directory
(``streamed.mapped_graph``) and writes its parts with the streamed writer (``streamed.write_streamed``), whose bytes
equal the in-memory writer's (tests/test_partition_stream.py). Each part's store is written by exactly one unit, so
the artifact is byte-identical however parts are grouped (tests/test_executor_partition.py).

Why groups of parts and not one unit per part: every unit spills the graph's CSR once (a part's rows are spread
over the whole orig id range), so one unit per worker slot (``executor.part_groups``). ``local`` runs no unit:
the stage writes the parts itself, as before executors.

A rerun of a unit (Dask reschedules the units of a worker that died) first deletes its parts' stores
(``storage.partition.remove_parts``), so a part half written by the first try leaves no file behind and the rerun
writes the same bytes.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from stages.executor import unit_record
from stages.meter import anon_rss_bytes, measure
from stages.partition.streamed import mapped_graph, write_streamed
from storage import ArtifactStore, Manifest
from storage.graph import GraphArtifact
from storage.partition import read_book, remove_parts
from storage.writer import WorkDir


@dataclass(frozen=True)
class PartsJob:
    """One unit: write the stores of ``parts`` of the book in ``out`` from the graph of ``download``."""

    root: str
    download: Manifest
    out: WorkDir
    parts: tuple[int, ...]
    progress: bool = False

    @property
    def label(self) -> str:
        """The unit's name in Prefect's task runs: its parts."""
        first, last = self.parts[0], self.parts[-1]
        return f"parts-{first}-{last}" if len(self.parts) > 1 else f"part-{first}"


def write_parts(job: PartsJob) -> dict[str, Any]:
    """The unit: ``job.parts`` written, each from nothing. Returns its parts, their edge split sizes and fixed
    negatives' shapes (``streamed.link_stats``' lists, in the order of ``parts``) and its wall time and peak
    memory."""
    artifact = GraphArtifact(ArtifactStore(job.root), job.download)
    start_anon = anon_rss_bytes()
    with measure() as cost:
        with job.out.scratch() as scratch:
            book = read_book(job.out)
            graph = mapped_graph(artifact, scratch)
            remove_parts(job.out, job.parts)
            link_sizes, neg_shapes = write_streamed(job.out, graph, book, job.parts, job.progress)
            del graph, book   # the memory maps closed before their scratch directory goes
    return {"parts": list(job.parts), "link_sizes": link_sizes, "neg_shapes": neg_shapes,
            "start_anon_bytes": start_anon, **cost}


def unit_figures(results: list[dict[str, Any]], slots: int) -> dict[str, Any]:
    """The summary's executor figures: the slots and each unit's parts, time and memory (a worker's peak memory
    is not this process's)."""
    return {"executor_slots": slots, "units": [unit_record(u["parts"], u) for u in results]}


def part_lists(results: list[dict[str, Any]], num_parts: int) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """Every part's edge split sizes and negatives' shapes, in part order, from the units' results."""
    link_sizes: list[dict[str, Any]] = [{}] * num_parts
    neg_shapes: list[dict[str, Any]] = [{}] * num_parts
    for unit in results:
        for p, sizes, shapes in zip(unit["parts"], unit["link_sizes"], unit["neg_shapes"]):
            link_sizes[p], neg_shapes[p] = sizes, shapes
    return link_sizes, neg_shapes
