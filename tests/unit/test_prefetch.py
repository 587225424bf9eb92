"""PayloadPool: bounded prefetch with a loader thread; stalls, hits, peak bytes (fake loaders that sleep)."""

import threading
import time

import pytest
import torch

from prism.runtime.replay.prefetch import PayloadPool

ITEM = 1000   # bytes of one float32 payload of 250 elements


class FakeLoader:
    """Loads key 'k<i>' as a float32 tensor of `sizes[key]` bytes filled with i, after `delay` seconds."""

    def __init__(self, delay: float, sizes: dict[str, int] | None = None, fail: str | None = None):
        self.delay, self.sizes, self.fail = delay, sizes or {}, fail
        self.calls: list[str] = []
        self.lock = threading.Lock()

    def size_of(self, key: str) -> int:
        return self.sizes.get(key, ITEM)

    def __call__(self, key: str) -> torch.Tensor:
        with self.lock:
            self.calls.append(key)
        time.sleep(self.delay)
        if key == self.fail:
            raise OSError(f"payload file of {key} is truncated")
        return torch.full((self.size_of(key) // 4,), float(key[1:]))


def wait_for(cond, timeout=20.0):
    end = time.monotonic() + timeout
    while not cond():
        assert time.monotonic() < end, "condition not reached"
        time.sleep(0.005)


def use(pool, keys, compute=0.0):
    for k in keys:
        t = pool.get(k)
        assert t[0].item() == float(k[1:])
        time.sleep(compute)
        pool.release(k)


def test_prefetch_off_every_get_stalls():
    loader = FakeLoader(0.01)
    keys = [f"k{i}" for i in range(5)]
    with PayloadPool(0, loader, loader.size_of) as pool:
        pool.schedule(keys)
        use(pool, keys)
        s = pool.stats()
    assert s["stalls"] == 5 and s["direct"] == 5 and s["hits"] == 0
    assert s["peak_bytes"] == 0 and s["loaded"] == 0 and s["stall_s"] >= 5 * 0.01
    assert loader.calls == keys


def test_no_stalls_when_the_pool_is_big_enough_and_the_schedule_known_ahead():
    loader = FakeLoader(0.002)
    keys = [f"k{i}" for i in range(20)]
    with PayloadPool(4 * ITEM, loader, loader.size_of) as pool:
        pool.schedule(keys)
        wait_for(lambda: pool.stats()["resident_bytes"] == 4 * ITEM)   # filled ahead of the first use
        use(pool, keys, compute=0.05)      # each use leaves 25x a load's time to refill
        s = pool.stats()
    assert s["stalls"] == 0 and s["hits"] == 20 and s["loaded"] == 20 and s["direct"] == 0
    assert s["peak_bytes"] == 4 * ITEM


def test_a_slow_loader_stalls():
    loader = FakeLoader(0.05)
    keys = [f"k{i}" for i in range(6)]
    with PayloadPool(2 * ITEM, loader, loader.size_of) as pool:
        pool.schedule(keys)
        use(pool, keys)
        s = pool.stats()
    assert s["stalls"] >= 4 and s["stalls"] + s["hits"] == 6


def test_peak_never_above_capacity_with_mixed_sizes():
    sizes = {f"k{i}": ITEM * (1 + i % 3) for i in range(40)}
    loader = FakeLoader(0.001, sizes)
    keys = list(sizes)
    cap = int(3.5 * ITEM)
    with PayloadPool(cap, loader, loader.size_of) as pool:
        pool.schedule(keys)
        use(pool, keys, compute=0.002)
        s = pool.stats()
    assert 2 * ITEM <= s["peak_bytes"] <= cap
    assert s["loaded"] + s["direct"] == 40 and s["resident_bytes"] == 0


def test_payload_bigger_than_capacity_loads_alone():
    sizes = {"k0": ITEM, "k1": 5 * ITEM, "k2": ITEM}
    loader = FakeLoader(0.001, sizes)
    with PayloadPool(2 * ITEM, loader, loader.size_of) as pool:
        pool.schedule(["k0", "k1", "k2"])
        wait_for(lambda: pool.stats()["loaded"] == 1)
        time.sleep(0.05)
        assert pool.stats()["loaded"] == 1          # k1 waits for the pool to empty
        use(pool, ["k0", "k1", "k2"], compute=0.01)
        s = pool.stats()
    assert s["oversize"] == 1 and s["peak_bytes"] == 5 * ITEM and s["loaded"] + s["direct"] == 3


def test_key_scheduled_twice_is_kept_until_released_twice():
    loader = FakeLoader(0.001)
    with PayloadPool(3 * ITEM, loader, loader.size_of) as pool:
        pool.schedule(["k1", "k2", "k1"])
        wait_for(lambda: not pool._queue and pool._inflight is None)
        assert loader.calls == ["k1", "k2"]
        use(pool, ["k1", "k2"])
        assert pool.stats()["resident_bytes"] == ITEM      # k1's second use still ahead
        use(pool, ["k1"])
        assert pool.stats()["resident_bytes"] == 0 and pool.stats()["hits"] == 3


def test_out_of_order_use_loads_directly_without_deadlock():
    loader = FakeLoader(0.001)
    keys = [f"k{i}" for i in range(6)]
    with PayloadPool(2 * ITEM, loader, loader.size_of) as pool:
        pool.schedule(keys)
        wait_for(lambda: pool.stats()["resident_bytes"] == 2 * ITEM)
        held = pool.get("k5")               # pool full of k0, k1: k5 loads in the caller
        assert held[0].item() == 5.0
        use(pool, ["k0", "k1", "k2", "k3", "k4"])
        pool.release("k5")
        s = pool.stats()
    assert s["direct"] == 1 and loader.calls.count("k5") == 1 and s["peak_bytes"] <= 2 * ITEM


def test_unscheduled_key_and_load_error():
    loader = FakeLoader(0.001, fail="k2")
    with PayloadPool(2 * ITEM, loader, loader.size_of) as pool:
        assert pool.get("k7")[0].item() == 7.0     # never scheduled: direct
        pool.schedule(["k2"])
        with pytest.raises(RuntimeError, match="payload 'k2'.*truncated"):
            pool.get("k2")
        pool.release("k2")
        assert pool.stats()["direct"] == 1


def test_negative_capacity_is_refused():
    with pytest.raises(ValueError, match="capacity"):
        PayloadPool(-1, FakeLoader(0))


def test_default_size_is_the_file_size(tmp_path):
    path = tmp_path / "p.pt"
    torch.save(torch.arange(10.0), path)
    with PayloadPool(10 << 20, lambda k: torch.load(k)) as pool:
        pool.schedule([str(path)])
        assert torch.equal(pool.get(str(path)), torch.arange(10.0))
        pool.release(str(path))
        assert pool.stats()["peak_bytes"] >= 40
