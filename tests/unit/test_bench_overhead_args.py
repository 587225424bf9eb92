"""`prism bench overhead` refuses a step count that leaves no iteration after its warm-up, before any run."""

import pytest

from prism.bench import overhead


@pytest.mark.parametrize("steps", ["1", "2"])
def test_too_few_steps_are_refused_with_the_fix(steps, capsys):
    with pytest.raises(SystemExit) as exc:
        overhead.main(["--steps", steps])
    assert exc.value.code == 2
    err = capsys.readouterr().err
    assert f"--steps {steps} leaves no iteration time" in err and "--steps 3 or more" in err


def test_three_steps_leave_one_iteration_time():
    assert 3 - overhead.warmup_steps(3) - 1 == 1
    assert overhead.warmup_steps(40) == 8
