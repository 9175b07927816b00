"""Loading a recipe and planning it read as a straight walk (first calls, as scripts/call_path.py counts them): no
module calls back into one that called it, each module of config/ is entered once while loading, and the plan
enters config/ once, to resolve the phase list, before it plans the phases."""

import sys
from pathlib import Path

from tests.helpers import ROOT
from vitlarge.config.load import load_config
from vitlarge.plan.plan import make_plan

PACKAGES = tuple(str(ROOT / "vitlarge" / p) + "/" for p in ("config", "plan"))


def walk(fn) -> list[str]:
    """The modules of config/ and plan/ whose functions ``fn`` first calls, one entry per stay."""
    seen, stays = set(), []

    def profile(frame, event, arg):
        code = frame.f_code
        if event != "call" or code in seen or not code.co_filename.startswith(PACKAGES):
            return
        seen.add(code)
        name = str(Path(code.co_filename).relative_to(ROOT / "vitlarge"))
        if not stays or stays[-1] != name:
            stays.append(name)

    sys.setprofile(profile)
    try:
        fn()
    finally:
        sys.setprofile(None)
    return stays


def test_loading_and_planning_a_recipe_enter_each_module_once():
    holder = {}
    stays = walk(
        lambda: holder.setdefault(
            "plan",
            make_plan(load_config(ROOT / "recipes/demo_digits.py", ["data.source=synthetic", "train.max_steps=1"]), 1),
        )
    )
    assert stays == [
        "config/load.py",
        "config/overrides.py",
        "config/coerce.py",
        "config/checks.py",
        "config/schema.py",
        "config/profile_window.py",
        "config/phase_list.py",
        "config/trackers.py",
        "plan/plan.py",
        "config/phase_list.py",
        "plan/phases.py",
    ], stays
    assert holder["plan"].total_steps > 0
