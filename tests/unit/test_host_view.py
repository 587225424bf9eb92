"""A capture over hosts, the pure parts: which ranks a host runs, rank -> host names, and one host's
coordinator, whose peers on other hosts arrive through `arrive_remote`."""

from prism.runtime.capture.coordinator import Coordinator
from prism.runtime.launch.hosts import HostView, node_names


def test_a_host_runs_a_contiguous_block_of_the_world():
    v = HostView(nnodes=4, node_rank=2, nproc=3, master_addr="h0", master_port=29500)
    assert v.world == 12 and list(v.ranks()) == [6, 7, 8] and list(v.ranks(0)) == [0, 1, 2]
    assert [v.host_of(r) for r in (0, 5, 6, 11)] == [0, 1, 2, 3]
    assert HostView.from_dict(v.as_dict()) == v


def test_node_names_tell_hosts_apart_even_when_they_share_a_hostname():
    hosts = [{"node_rank": 0, "hostname": "vm", "ranks": [0, 2]}, {"node_rank": 1, "hostname": "vm", "ranks": [2, 4]}]
    assert node_names(hosts) == {0: "vm#0", 1: "vm#0", 2: "vm#1", 3: "vm#1"}
    hosts[1]["hostname"] = "node2"
    assert node_names(hosts) == {0: "vm", 1: "vm", 2: "node2", 3: "node2"}


def test_a_host_coordinator_completes_a_collective_when_the_remote_members_arrive():
    c = Coordinator(4, 1, local=range(0, 2))  # this host: ranks 0, 1; ranks 2, 3 run elsewhere
    for r in (0, 1):
        c.handle(r, ("hello",))
    key, members, info = ("c", "g", 0), (0, 1, 2, 3), ("all_reduce", "float32", "4", 16, "member")
    c.handle(0, ("arrive", key, members, info))
    assert c.handle(0, ("wait", [key], 10)) == [(1, ("go", 0, False))]
    c.handle(1, ("arrive", key, members, info))
    assert c.handle(1, ("wait", [key], 20)) == []
    assert c.stuck()  # locally: only the other host can move it (host_route names a hang after a while)
    assert "runs on another host" in c.doing(2)
    assert c.arrive_remote(2, key, members, info) == []
    assert c.arrive_remote(3, key, members, info) == [(0, ("go", 0, False))]
    assert c.keys[key].readers() == 2  # only this host's members read (and finish) it here
    for r in (0, 1):
        c.handle(r, ("done", [key]))
    assert key not in c.keys and c.finished_keys == [key]
    c.handle(0, ("exit", 0))
    assert not c.all_exited()
    c.handle(1, ("exit", 0))
    assert c.all_exited()


def test_host_options_are_checked_before_anything_starts():
    import pytest

    from prism.runtime.launch.launch_spec import LaunchError, parse, validate

    prog = ["-m", "prism.workloads.moe_gpt"]
    cases = {
        ("--nnodes", "2", "--node-rank", "2"): "--node-rank 2 outside 0..1",
        ("--nnodes", "2", "--mode", "real"): "spreads a capture over hosts",
        ("--nnodes", "2", "--mode", "capture", "--master-addr", "h0"): "--nnodes needs --master-port",
        ("--nnodes", "2", "--mode", "capture", "--master-port", "29500"): "--nnodes needs --master-addr",
        ("--nnodes", "2", "--mode", "capture", "--master-port", "29500", "--master-addr", "h0"): "--nnodes needs --out",
    }
    for opts, message in cases.items():
        spec = parse(["--nproc", "2", *opts, *prog])
        with pytest.raises(LaunchError, match=message):
            validate(spec)
    spec = parse(["--nproc", "1", "--nnodes", "2", "--node-rank", "1", "--mode", "capture", "--master-port", "29500",
                  "--master-addr", "h0", "--out", "/tmp/x", *prog])
    validate(spec)  # one rank a host is a capture of two ranks
    assert (spec.nnodes, spec.node_rank, spec.master_addr) == (2, 1, "h0")
