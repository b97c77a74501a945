"""The multi-node job description (torch-free): validation, torchrun arguments, Slurm, and the same-artifacts check."""

from __future__ import annotations

import os
import socket

import psutil
import pytest

from stages.jobs.cluster import (
    Cluster,
    bound_here,
    expand_hostlist,
    from_slurm,
    parse_endpoint,
    rank_threads,
    usable_cpus,
)
from stages.train.spec import check_same_artifacts, code_digest, runtime_fingerprint
from storage import InputError


def test_single_host_is_standalone():
    assert Cluster().torchrun_args(4) == ["--standalone", "--nproc_per_node=4"]
    assert not Cluster().multi_node and Cluster().publishes


def test_multi_node_arguments_split_ranks_evenly():
    c = Cluster(nnodes=2, node_rank=1, rdzv_endpoint="192.0.2.10:29400", rdzv_id="job7", local_addr="192.0.2.11",
                join_timeout_s=30)
    args = c.torchrun_args(4)
    assert "--nnodes=2" in args and "--nproc_per_node=2" in args and "--rdzv_backend=c10d" in args
    assert "--rdzv_endpoint=192.0.2.10:29400" in args and "--rdzv_id=job7" in args
    assert "--rdzv_conf=join_timeout=30" in args     # 192.0.2.10 (TEST-NET) is not this machine's
    assert "--local_addr=192.0.2.11" in args
    assert not c.publishes and Cluster(nnodes=2, rdzv_endpoint="h:1").publishes


@pytest.mark.parametrize("kwargs, message", [
    ({"nnodes": 2}, "--nnodes 2 needs --rdzv HOST:PORT"),
    ({"nnodes": 2, "node_rank": 2, "rdzv_endpoint": "h:1"}, "--node-rank 2 is not in 0..1"),
    ({"nnodes": 0}, "--nnodes must be >= 1"),
    ({"nnodes": 2, "rdzv_endpoint": "h"}, "--rdzv expects HOST:PORT"),
    ({"nnodes": 2, "rdzv_endpoint": "h:99999"}, "--rdzv expects HOST:PORT"),
    ({"nnodes": 2, "rdzv_endpoint": "h:1", "join_timeout_s": 0}, "join timeout must be > 0"),
])
def test_bad_cluster_descriptions_fail_in_one_line(kwargs, message):
    with pytest.raises(InputError, match=message):
        Cluster(**kwargs)


def test_partitions_must_spread_evenly_over_nodes():
    with pytest.raises(InputError, match="3 partitions on 2 nodes: .* repartition into 2 or 4 partitions"):
        Cluster(nnodes=2, rdzv_endpoint="h:1").nproc_per_node(3)
    with pytest.raises(InputError, match="1 partitions on 2 nodes: .* repartition into 2 partitions"):
        Cluster(nnodes=2, rdzv_endpoint="h:1").nproc_per_node(1)
    assert Cluster(nnodes=4, rdzv_endpoint="h:1").nproc_per_node(8) == 2


def test_endpoints_parse_with_ipv6():
    assert parse_endpoint("node01:29400") == ("node01", 29400)
    assert parse_endpoint("[fe80::1]:80") == ("fe80::1", 80)


def test_slurm_host_lists_expand_like_scontrol():
    assert expand_hostlist("gpu[01-03,07],login1") == ["gpu01", "gpu02", "gpu03", "gpu07", "login1"]
    assert expand_hostlist("r[1-2]n[8-9]") == ["r1n8", "r1n9", "r2n8", "r2n9"]
    assert expand_hostlist("single") == ["single"]
    with pytest.raises(InputError, match="malformed Slurm host"):
        expand_hostlist("gpu[01-03")
    with pytest.raises(InputError, match="malformed Slurm host range"):
        expand_hostlist("gpu[a-b]")


def test_slurm_environment_describes_the_job():
    env = {"SLURM_JOB_ID": "4242", "SLURM_STEP_ID": "0", "SLURM_JOB_NUM_NODES": "3", "SLURM_NTASKS": "3",
           "SLURM_JOB_NODELIST": "gpu[07-09]", "SLURM_NODEID": "2"}
    c = from_slurm(env, port=29555)
    assert (c.nnodes, c.node_rank, c.rdzv_endpoint, c.rdzv_id) == (3, 2, "gpu07:29555", "slurm-4242.0")
    one = from_slurm({"SLURM_JOB_ID": "1", "SLURM_JOB_NODELIST": "n1", "SLURM_NNODES": "1"})
    assert not one.multi_node


def test_slurm_misuse_is_explained():
    with pytest.raises(InputError, match="SLURM_JOB_ID is not set"):
        from_slurm({})
    with pytest.raises(InputError, match="8 tasks on 2 nodes.*--ntasks-per-node=1"):
        from_slurm({"SLURM_JOB_ID": "1", "SLURM_NNODES": "2", "SLURM_NTASKS": "8", "SLURM_JOB_NODELIST": "a,b"})


def test_the_node_owning_the_rendezvous_address_says_it_serves_it():
    assert not bound_here("127.0.0.1")            # loopback: torchrun's own choice copes with shared machines
    assert not bound_here("192.0.2.1")            # TEST-NET-1, never assigned
    assert not bound_here("no-such-host.invalid")
    mine = [a.address for addrs in psutil.net_if_addrs().values() for a in addrs
            if a.family == socket.AF_INET and not a.address.startswith("127.")]
    if not mine:
        pytest.skip("this machine has no non-loopback IPv4 address")
    assert bound_here(mine[0])
    assert Cluster(nnodes=2, rdzv_endpoint=f"{mine[0]}:29400").rdzv_conf().endswith(",is_host=1")


def _rec(rank: int, node: int, **fingerprint: str) -> dict:
    return {"rank": rank, "node": node, "host": f"host{node}", "fingerprint": {"train": "t1", **fingerprint}}


def test_every_rank_must_train_on_the_same_builds():
    same = {"partition": "p1 build aa", "features": "f1 build bb", "hotness": "h1 build cc"}
    check_same_artifacts([_rec(0, 0, **same), _rec(1, 0, **same), _rec(2, 1, **same)])
    other = {**same, "hotness": "h1 build dd"}
    with pytest.raises(InputError) as err:   # node 0 is the reference, whichever global ranks it holds
        check_same_artifacts([_rec(0, 1, **other), _rec(1, 0, **same)])
    msg = str(err.value)
    assert "node 1 (host1, rank 0) does not train on the artifacts of node 0 (host0, rank 1)" in msg
    assert "hotness: h1 build cc on node 0 vs h1 build dd on node 1" in msg and "\n" not in msg
    assert "partition:" not in msg and "features:" not in msg   # only what differs is named


def test_nodes_on_other_code_are_told_apart(tmp_path):
    for pkg in ("storage", "stages/train"):
        (tmp_path / pkg).mkdir(parents=True)
        (tmp_path / pkg / "m.py").write_text("X = 1\n")
    before = code_digest(tmp_path)
    assert code_digest(tmp_path) == before
    (tmp_path / "stages/train/m.py").write_text("X = 2\n")
    assert code_digest(tmp_path) != before
    assert runtime_fingerprint().startswith(f"code {code_digest()}, torch ")
    with pytest.raises(InputError, match="runtime: code aaa on node 0 vs code bbb on node 1"):
        check_same_artifacts([_rec(0, 0, runtime="code aaa"), _rec(1, 1, runtime="code bbb")])


def test_ranks_use_the_cpus_they_are_allowed(monkeypatch: pytest.MonkeyPatch):
    monkeypatch.setattr(os, "sched_getaffinity", lambda pid: {3, 5})
    assert usable_cpus() == 2
    assert rank_threads(None, 2) == 1 and rank_threads(None, 4) == 1   # never below one thread
    assert rank_threads(3, 2) == 3                                      # an explicit setting wins
