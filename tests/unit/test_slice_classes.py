"""`--representative` at scale: the measured slices follow the layout's distinct rank classes, not W.

A rank's class is its work (PP stage, operation sequence; an all-to-all whose sizes follow the data does not
split it) and its place in its slice (for each of its groups, how many members run beside it). The synthetic
graphs (`layoutgen.moe_graph`) have the reference workload's structure; on real captures of the weak layouts
(W = 16, 64, 128, 256, 512 on this VM) the planner measured the same counts as here: 1, 2, 1, 1, 1 at P=16,
2 at P=4 and P=2 (docs/results/scale/s10/slice_counts.txt), under the plan's bytes rule (the default then). The
default rule since session 19 (sync-first: pairs that wait on each other first) keeps a slice's TP, PP and EP
partners together at W=64 too (the DP gradient buckets are asynchronous): 1 measured slice there, not compared
with a real capture of that layout.
"""

import polars as pl
import pytest

from prism.calibrate.from_slices import representatives
from prism.slices import plan as slice_plan
from tests.unit.layoutgen import moe_graph


def measured(table) -> int:
    return len(set(table.filter(table["measured"])["slice"].to_pylist()))


@pytest.mark.parametrize("rule, w, expected", [("bytes", 16, 1), ("bytes", 64, 2), ("bytes", 256, 1),
                                               ("bytes", 1024, 1), ("bytes", 8192, 1),
                                               *(("sync-first", w, 1) for w in (16, 64, 256, 1024, 8192))])
def test_weak_layouts_need_a_handful_of_slices_at_any_w(rule, w, expected):
    # tp2·pp2·ep2·dp(W/4) on P=16: under the bytes rule at W=64 a DP group (16) fits a slice and the planner keeps
    # it whole, one slice a stage; from W=256 on (at any W under sync-first, the DP buckets being asynchronous) a
    # slice holds TP, PP and EP partners of both stages and one stands for all
    table = slice_plan.plan_tables(*moe_graph(2, 2, w // 4, 2), 16, representative=True, rule=rule)
    assert len(set(table["slice"].to_pylist())) == w // 16
    assert measured(table) == expected
    representatives(table.to_pylist())  # every unmeasured slice has its classes in the slice measuring it


@pytest.mark.parametrize("layout, expected", [((2, 4, 128, 8), 4), ((8, 4, 256, 8), 4)])
def test_the_cost_layouts_at_1024_and_8192(layout, expected):
    # before: every rank its own class (the token all-to-all's sizes differ between EP groups), so at W=1024
    # every one of the 64 slices was measured
    table = slice_plan.plan_tables(*moe_graph(*layout), 16, representative=True)
    assert measured(table) == expected
    representatives(table.to_pylist())


def test_data_sized_all_to_alls_do_not_split_classes_but_other_sizes_do():
    ev, cm, rk, gr = moe_graph(2, 2, 4, 2)
    classes = slice_plan.rank_classes(ev, rk)
    assert len({classes[r] for r in range(8)}) == 1  # stage 0: the same work, whatever the routing
    assert len({classes[r] for r in range(8, 16)}) == 1
    assert classes[0] != classes[8]
    # a fixed-size op of another size is other work: rank 3's first TP all-reduce twice as large (and its peer's)
    first = ev.filter((pl.col("rank").is_in([2, 3])) & (pl.col("op") == "all_reduce")).group_by("rank").agg(
        pl.col("seq").min())
    bigger = ev.join(first.with_columns(pl.lit(True).alias("hit")), on=["rank", "seq"], how="left")
    bigger = bigger.with_columns(pl.when(pl.col("hit")).then(pl.col("bytes") * 2).otherwise(pl.col("bytes"))
                                 .alias("bytes")).drop("hit")
    changed = slice_plan.rank_classes(bigger, rk)
    assert changed[3] != changed[1] and changed[2] == changed[3] and changed[0] == changed[1]


def test_a_slice_that_replays_a_partner_is_not_equivalent_to_one_that_runs_it():
    # W=8 tp1·pp2·dp4·ep2: stage pairs (d, 4 + d). Slices {0, 4} and {1, 5} hold their stage partner;
    # {2, 7} and {3, 6} hold the same classes of work (one rank of each stage) but their partners are replayed
    ev, cm, rk, gr = moe_graph(1, 2, 4, 2)
    work = slice_plan.rank_classes(ev, rk)
    assert work[0] == work[2] and work[4] == work[7]
    places = slice_plan.Places(cm, gr)
    classes, by = slice_plan.representatives_of([[0, 4], [1, 5], [2, 7], [3, 6]], work, places, True)
    assert by == {0: 0, 1: 0, 2: 2, 3: 2}
    assert classes[0] != classes[2]  # the same work, another place
