"""Forked ranks (tests/helpers/forked.py) keep what the suite's contracts need of a started process: deprecations
are errors, each rank draws its own seeds and runs in its own session, and a module runs afresh as ``__main__``."""

import json

from tests.helpers import launcher

PROBE = "tests/helpers/forked_probe.py"


def records(text: str) -> list[dict]:
    return [json.loads(line) for line in text.splitlines() if line.startswith("{")]


def test_a_deprecation_in_a_forked_process_fails_it():
    r = launcher.python([PROBE, "deprecate"])
    assert r.returncode == 1 and "DeprecationWarning: a deprecated call" in r.stderr, r.stdout + r.stderr
    assert "survived" not in r.stdout
    (seen,) = records(r.stdout)
    assert "error::DeprecationWarning" in seen["warnoptions"]
    two = launcher.run(["deprecate"], nproc=2, script=(PROBE,))
    assert two.returncode == 1 and two.stdout.count("survived") == 0, two.stdout + two.stderr


def test_each_forked_rank_draws_its_own_seeds_in_its_own_session():
    r = launcher.run([], nproc=2, script=(PROBE,))
    again = launcher.python([PROBE])
    assert r.returncode == 0 == again.returncode, r.stderr + again.stderr
    seen = records(r.stdout) + records(again.stdout)
    assert sorted(str(x["rank"]) for x in seen) == ["0", "1", "None"]  # `python` sets no launcher variable
    assert all(x["own_session"] for x in seen)
    assert len({x["torch_seed"] for x in seen}) == 3 and len({x["numpy_draw"] for x in seen}) == 3
    assert all(x["main"].endswith(PROBE) for x in seen)


def test_a_module_runs_afresh_as_main():
    r = launcher.python(["-m", "vitlarge.evaluate", "--help"])
    assert r.returncode == 0 and "usage:" in r.stdout, r.stderr
    assert "found in sys.modules" not in r.stderr  # runpy's warning when a preloaded module is run again
