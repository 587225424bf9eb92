"""`prism.bench.fidelity_terms`: one class of another run's measurements swapped into a real run's own inputs (the
committed truth runs of the fidelity bench, `tests/data/fidelity/`)."""

from __future__ import annotations

import numpy as np
import pytest

from prism.bench import fidelity_terms as terms
from prism.calibrate.stage import load_graph
from tests.fixtures import data


def _halves(job) -> np.ndarray:
    """A slice per half of the ranks, as a P = W/2 plan puts them (the terms only need the membership)."""
    return (job.rank >= job.graph.n_ranks // 2).astype(np.int64)


def test_the_comm_classes_split_every_comm_once():
    job = load_graph(data("fidelity", "device-4-pp2dp4-ep4-mb2"))
    classes = terms.comm_classes(job, _halves(job))
    stacked = np.stack(list(classes.values()))
    assert (stacked.sum(axis=0) == 1).all()  # each comm in exactly one class
    assert all(c.any() for c in classes.values())  # this layout has p2p, in-slice and cross-slice comms


def test_a_run_swapped_into_itself_moves_nothing():
    job = load_graph(data("fidelity", "device-3-dp8-var"))
    own = terms.measured(job)
    out = terms.swap_terms(job, own, own, terms.comm_classes(job, _halves(job)))
    base = out.pop("own ms")
    assert out and all(v == 0.0 for v in out.values()), out
    assert base == pytest.approx(191.77, abs=0.2)  # the sweep on the run's own inputs is the run (fidelity_model)


def test_another_real_runs_inputs_give_its_own_time_and_a_class_alone_does_not():
    """All of device-4's measurements on device-3's graph give device-4's own time (the model is exact on each); its
    comm delays alone, with device-3's compute, move the time by several % (the floor of a swap, docs/fidelity.md)."""
    a, b = (load_graph(data("fidelity", f"device-{n}-dp8-var")) for n in (3, 4))
    cmap = terms._aligned(a, b, "dp8-var")
    b_dur, b_x = terms.measured(b)
    every = np.ones(a.graph.n_comms, dtype=bool)
    out = terms.swap_terms(a, terms.measured(a), (b_dur, b_x[cmap]), {"all comms": every})
    b_own = terms.iteration_ms(b, b_dur, b_x)
    assert out["all"] == pytest.approx(100 * (b_own - out["own ms"]) / out["own ms"], abs=1.0)
    assert abs(out["comm delays: all comms"]) > 2.0, out


def test_graphs_of_two_programs_are_refused():
    a = load_graph(data("fidelity", "device-3-dp8-var"))
    b = load_graph(data("fidelity", "device-3-pp2dp4-mb8"))
    with pytest.raises(ValueError, match="do not align"):
        terms._aligned(a, b, "x")


def test_the_command_names_a_missing_folder(tmp_path, capsys):
    assert terms.main([str(tmp_path)]) == 2
    assert "truth0/graph is missing" in capsys.readouterr().err
