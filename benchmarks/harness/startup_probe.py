"""Runs a training script as ``python SCRIPT ARGS`` runs it, logging when each start-up phase begins and ends.

    torchrun --nproc_per_node 2 benchmarks/harness/startup_probe.py train.py --config recipes/demo_digits.py ...

For `benchmarks.bench_startup`, on both sides (vitlarge's train.py, timm's train.py). Each process appends one JSON
line per event to ``$VITLARGE_STARTUP_LOG/rank<RANK>.jsonl`` as it happens (a process that leaves with ``os._exit``
loses none): ``{"t": time.time(), "c": time.process_time(), "e": event, ...}`` (``c``: this process's CPU seconds, all
its threads), with these events:

* ``process``: when the kernel started the process (``/proc/self/stat``), and ``probe``: this file's first line;
* ``tick``: every `TICK_S` seconds from a thread, so that the CPU seconds at any moment can be interpolated;
* ``import_start`` / ``import_end`` with ``name``: the first import of each module of `TRACKED` (a module executed
  inside another's import is nested in its span: `benchmarks.bench_startup` subtracts it);
* ``group_start`` / ``group_end``: ``torch.distributed.init_process_group`` (the rendezvous);
* for a vitlarge ``train.py``, the run's events, from a hook put first and one put last in the list hooks/'s
  ``build_hooks`` returns: ``train_start`` (``first``: before the other hooks' ``on_train_start``, where the trackers
  start), ``step`` (every optimizer step's end), ``train_end`` (``first``: before the other hooks' ``on_train_end``,
  where the picture is drawn and TensorBoard closes), ``export``, ``close``.

Nothing else of the script changes: ``sys.path[0]`` and ``sys.argv`` are what ``python SCRIPT ARGS`` gives it, it
runs as ``__main__``, and this file imports only the standard library.
"""

import importlib.abc
import json
import os
import runpy
import sys
import threading
import time

TRACKED = (
    "torch",
    "torch.distributed.checkpoint",
    "torchvision",
    "torch._dynamo",
    "timm",
    "colossalai",
    "colossalai.booster",
    "vitlarge.distributed.booster",
    "peft",
    "transformers",
    "bitsandbytes",
    "galore_torch",
    "nvidia.dali",
    "torch.utils.tensorboard",
    "matplotlib",
    "mlflow",
    "wandb",
)
"""Modules whose first import is timed (a package's span includes its submodules, unless they are listed too)."""

TICK_S = 0.25

_LOG = None
_LOCK = threading.Lock()


def event(kind: str, **fields) -> None:
    """Appends one event, timestamped now, to this process's log."""
    global _LOG
    with _LOCK:
        if _LOG is None:
            folder = os.environ["VITLARGE_STARTUP_LOG"]
            _LOG = open(os.path.join(folder, f"rank{os.environ.get('RANK', '0')}.jsonl"), "a", buffering=1)
        _LOG.write(json.dumps({"t": time.time(), "c": time.process_time(), "e": kind, **fields}) + "\n")


def process_start() -> float:
    """When the kernel started this process (``/proc/self/stat`` field 22, clock ticks after boot), as time.time()."""
    with open("/proc/self/stat") as f:
        ticks = int(f.read().rsplit(")", 1)[1].split()[19])
    with open("/proc/stat") as f:
        boot = next(int(line.split()[1]) for line in f if line.startswith("btime "))
    return boot + ticks / os.sysconf("SC_CLK_TCK")


class _TimedLoader(importlib.abc.Loader):
    """A module's own loader, with its execution logged (``import_start``/``import_end``) and `_after` run."""

    def __init__(self, loader, name: str):
        self._loader, self._name = loader, name

    def __getattr__(self, attr):  # get_source, get_resource_reader, is_package ... as the loader has them
        return getattr(self._loader, attr)

    def create_module(self, spec):
        return self._loader.create_module(spec)

    def exec_module(self, module) -> None:
        event("import_start", name=self._name)
        try:
            self._loader.exec_module(module)
        finally:
            event("import_end", name=self._name)
        _after(self._name, module)


class _Finder(importlib.abc.MetaPathFinder):
    """First on ``sys.meta_path``: finds a `TRACKED` module through the finders after it, with its loader timed.
    (A spec may be found and never executed: ``importlib.util.find_spec`` asks whether a package is installed.)"""

    def find_spec(self, name, path, target=None):
        if name not in TRACKED and name not in ("torch.distributed", "hooks"):
            return None
        for finder in sys.meta_path[sys.meta_path.index(self) + 1 :]:
            find = getattr(finder, "find_spec", None)
            spec = find(name, path, target) if find else None
            if spec is not None:
                if spec.loader is not None and hasattr(spec.loader, "exec_module"):
                    spec.loader = _TimedLoader(spec.loader, name)
                return spec
        return None


def _after(name: str, module) -> None:
    """Wraps, once their module has run, the two calls the probe times beyond imports."""
    if name == "torch.distributed" and hasattr(module, "init_process_group"):
        init = module.init_process_group

        def init_process_group(*args, **kwargs):
            event("group_start")
            try:
                return init(*args, **kwargs)
            finally:
                event("group_end")

        module.init_process_group = init_process_group
    elif name == "hooks" and hasattr(module, "build_hooks"):
        build = module.build_hooks

        def build_hooks(*args, **kwargs):
            return [_timing_hook(first=True), *build(*args, **kwargs), _timing_hook(first=False)]

        module.build_hooks = build_hooks


def _timing_hook(first: bool):
    """A `vitlarge.events.Hook` logging the run's events (the first one in the list also each step's end)."""
    from vitlarge.events import Hook

    class Timing(Hook):
        def on_train_start(self, run) -> None:
            event("train_start", first=first)

        def on_step_end(self, run, m) -> None:
            if first:
                event("step", step=m.step)

        def on_train_end(self, run, summary) -> None:
            event("train_end", first=first)

        def on_export(self, run, path) -> None:
            if first:
                event("export")

        def on_close(self, run) -> None:
            if not first:
                event("close")

    return Timing()


def _tick() -> None:
    while True:
        event("tick")
        time.sleep(TICK_S)


def main() -> None:
    event("process", at=process_start())
    event("probe")
    threading.Thread(target=_tick, name="startup-probe", daemon=True).start()
    script = os.path.abspath(sys.argv[1])
    sys.argv = sys.argv[1:]
    sys.path[0] = os.path.dirname(script)
    sys.meta_path.insert(0, _Finder())
    runpy.run_path(script, run_name="__main__")


if __name__ == "__main__":
    main()
