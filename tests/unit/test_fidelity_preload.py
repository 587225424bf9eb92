"""prism.bench.fidelity_preload: per rank-iteration means per step of the program, not its short tail."""

import numpy as np

from prism.bench.fidelity_preload import whole_iterations


def test_the_tail_after_the_last_step_is_not_an_iteration():
    it = np.array([-1] * 3 + [0] * 86 + [1] * 90 + [2] * 90 + [3] * 4)
    assert whole_iterations(it).tolist() == [0, 1, 2]


def test_uneven_steps_all_count():
    it = np.array([0] * 50 + [1] * 90 + [2] * 60)
    assert whole_iterations(it).tolist() == [0, 1, 2]
