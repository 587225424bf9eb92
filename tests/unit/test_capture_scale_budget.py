"""`prism bench capture`'s memory check before a size starts: from what a rank measured at a smaller W."""

from prism.bench.capture_scale import memory_short

GIB, MIB = 2**30, 2**20


def _row(w, private_max=16.0, private_median=15.0, pss=None, written=0):
    return {"W": w, "rank_private_mib_max": private_max, "rank_private_mib_median": private_median,
            "pss_peak": pss if pss is not None else int(w * private_median * MIB + GIB),
            "raw_bytes": written, "payload_bytes": 0}


def test_nothing_measured_yet_starts():
    assert memory_short(8192, [], available=1 * GIB) is None


def test_fits_by_the_measured_rate():
    # 4096 ranks * 16 MiB = 64 GiB, + 1 GiB zygote etc. + 2 * 1 GiB written = 67 GiB
    done = [_row(1024), _row(2048, written=GIB)]
    assert memory_short(4096, done, available=68 * GIB) is None
    msg = memory_short(4096, done, available=66 * GIB)
    assert msg is not None
    assert "~67.0 GiB (16.0 MiB a rank as measured at W=2048" in msg and "only 66.0 GiB available" in msg
    assert "not started" in msg


def test_uses_the_largest_size_measured():
    done = [_row(1024, private_max=10.0), _row(2048, private_max=20.0)]  # grows with W: the latest rate counts
    msg = memory_short(8192, done, available=150 * GIB)
    assert msg is not None and "20.0 MiB a rank as measured at W=2048" in msg and "~161.0 GiB" in msg


def test_a_stage_over_the_time_left_is_stopped_and_says_so():
    import sys
    import time

    import pytest

    from prism.bench.capture_scale import _stage

    start = time.monotonic()
    with pytest.raises(RuntimeError, match=r"sleep failed \(-15\) after 2 s \(stopped: over the 2 s left"):
        _stage([sys.executable, "-c", "import time; time.sleep(60)"], "sleep", timeout=2)
    assert time.monotonic() - start < 20
