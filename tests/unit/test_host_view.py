"""A capture or emulation over hosts, the pure parts: which ranks a host runs, rank -> host names, and one host's
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
        ("--nnodes", "2", "--mode", "real"): "spreads a capture or an emulation over hosts",
        ("--nnodes", "2", "--mode", "emulate", "--sandbox", "1,8", "--master-port", "29500", "--master-addr", "h0",
         "--out", "/tmp/x"): r"--sandbox \[8\] outside 0..7 \(--nproc 4 x --nnodes 2\)",
        ("--nnodes", "2", "--mode", "capture", "--master-addr", "h0"): "--nnodes needs --master-port",
        ("--nnodes", "2", "--mode", "capture", "--master-port", "29500"): "--nnodes needs --master-addr",
        ("--nnodes", "2", "--mode", "capture", "--master-port", "29500", "--master-addr", "h0"): "--nnodes needs --out",
    }
    for opts, message in cases.items():
        spec = parse(["--nproc", "2" if "emulate" not in opts else "4", *opts, *prog])
        with pytest.raises(LaunchError, match=message):
            validate(spec)
    spec = parse(["--nproc", "1", "--nnodes", "2", "--node-rank", "1", "--mode", "capture", "--master-port", "29500",
                  "--master-addr", "h0", "--out", "/tmp/x", *prog])
    validate(spec)  # one rank a host is a capture of two ranks
    assert (spec.nnodes, spec.node_rank, spec.master_addr) == (2, 1, "h0")


def _two_hosts_on_a_store(work0, work1):
    """Run work0(store, view of host 0) and work1(store, view of host 1) at once over one real TCPStore."""
    import threading
    from datetime import timedelta

    import torch.distributed as dist

    from prism.runtime.launch.launcher import free_port

    port = free_port()
    views = [HostView(2, k, 1, "127.0.0.1", port, timeout_s=30) for k in (0, 1)]
    server = dist.TCPStore("127.0.0.1", port, 2, is_master=True, wait_for_workers=False, timeout=timedelta(seconds=30))
    client = dist.TCPStore("127.0.0.1", port, 2, is_master=False, wait_for_workers=False, timeout=timedelta(seconds=30))
    got = {}
    t = threading.Thread(target=lambda: got.update(one=work1(client, views[1])))
    t.start()
    got["zero"] = work0(server, views[0])
    t.join(30)
    return got["zero"], got["one"]


def test_the_clock_exchange_finds_another_hosts_clock_offset():
    """Host 1's clock runs 5 s ahead of host 0's (one machine, its clock shifted): the exchange's estimate
    is 5 s within half its shortest round trip, and host 0 gets it too."""
    import time

    from prism.runtime.launch.hosts import CLOCK_ROUNDS, sync_clocks

    ahead = 5_000_000_000
    zero, one = _two_hosts_on_a_store(lambda st, v: sync_clocks(st, v),
                                      lambda st, v: sync_clocks(st, v, clock=lambda: time.monotonic_ns() + ahead))
    mine = one[1]
    assert zero[1] == mine and zero[0] == {"clock_offset_ns": 0, "clock_rtt_ns": 0} and CLOCK_ROUNDS > 1
    assert 0 < mine["clock_rtt_ns"] and abs(mine["clock_offset_ns"] - ahead) <= mine["clock_rtt_ns"] // 2 + 1


def test_the_common_start_is_one_instant_on_every_hosts_clock():
    """The last party stamps t0 on its clock (host 0's or the other's); a party whose host clock is `offset`
    ahead of host 0's reads t0 + offset, whichever host stamped."""
    import threading
    import time

    from prism.runtime.emulate.common_start import T0_COUNT, common_start

    offset = 7_000_000_000
    for last in (0, 1):  # the host whose party arrives last
        def work(store, view, first=1 - last):
            got = {}
            other = threading.Thread(target=lambda: got.update(t=common_start(
                store, 2, offset=offset * first)))
            if view.node_rank == 0:
                other.start()  # the first party, on host `first`
                while store.add(T0_COUNT, 0) < 1:
                    time.sleep(0.001)
                mine = common_start(store, 2, offset=offset * last)
                other.join(10)
                return {first: got["t"], last: mine}
            return None

        t0, _ = _two_hosts_on_a_store(work, lambda st, v: None)
        assert t0[1] - t0[0] == offset, last


def test_an_emulation_host_runs_its_own_sandbox_ranks_and_host_0_the_worker():
    from prism.runtime.launch.zygote import REPLAY, _replay_ids
    from prism.runtime.launch.zygote_spec import ZygoteSpec

    def ids(node_rank):
        spec = ZygoteSpec(nproc=8, run_id="x", status_dir="/tmp", mode="emulate", ranks=[1, 6, 7],
                          hosts={"nnodes": 2, "node_rank": node_rank, "nproc": 4})
        return _replay_ids(spec)

    assert ids(0) == [1, REPLAY] and ids(1) == [6, 7]
    assert _replay_ids(ZygoteSpec(nproc=8, run_id="x", status_dir="/tmp", mode="emulate", ranks=[1, 6])) == [1, 6, REPLAY]


def test_another_hosts_sandbox_times_go_onto_host_0s_clock():
    import pyarrow as pa

    from prism import schemas
    from prism.emulate.outputs import clock_offsets, on_host0_clock

    meta = {"hosts": [{"ranks": [0, 2], "clock_offset_ns": 0}, {"ranks": [2, 4], "clock_offset_ns": 1000}]}
    assert clock_offsets(meta) == {0: 0, 1: 0, 2: 1000, 3: 1000} and clock_offsets({}) == {}
    names = ["t_start_ns", "t_end_ns", "t_complete_ns"]
    fields = [schemas.RAW_EVENTS.field(n) for n in names]
    table = pa.table([pa.array([5000, 6000]), pa.array([5500, 6500]), pa.array([5600, -1])], schema=pa.schema(fields))
    moved = on_host0_clock(table, 1000)
    assert moved.to_pydict() == {"t_start_ns": [4000, 5000], "t_end_ns": [4500, 5500], "t_complete_ns": [4600, -1]}
    assert moved.schema == table.schema and on_host0_clock(table, 0) is table
