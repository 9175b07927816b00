"""Colossal-AI's Booster and the plugin classes vitlarge uses, imported without the packages of LoRA and quantization.

``import colossalai.booster`` (Colossal-AI 0.5.0) spends about 10 s of its 13 s on 2 CPU cores (AMD EPYC) in peft
(which imports transformers, scikit-learn, scipy and pandas) and bitsandbytes, in every process a run starts:

* the package's ``__init__`` imports every plugin; Gemini's imports shardformer, ``colossalai.nn`` and galore_torch,
  whose 8-bit optimizers subclass bitsandbytes' classes;
* the modules the Booster itself needs bind peft's names when they load (``colossalai.interface.model``,
  ``colossalai.checkpoint_io.utils``, the DDP plugin: ``PeftModel`` for ``isinstance`` checks, the rest for saving
  LoRA adapters), and ``colossalai.quantization`` reads bitsandbytes' version.

The DDP plugin and `vitlarge.distributed.fsdp` use neither unless LoRA or quantization is asked for
(``Booster.enable_lora``), which vitlarge never does. So `load` (run by the first name asked for, `NAMES`: ``from
vitlarge.distributed.booster import Booster``) imports the Booster's modules with two changes that hold while they
load, and for nothing else:

1. ``colossalai.booster`` and ``colossalai.booster.plugin`` are made without running their ``__init__``, holding the
   names of theirs that are loaded here (`PACKAGES`). Reading any other name from them (``GeminiPlugin``) runs their
   ``__init__`` then, so every name still works.
2. peft and bitsandbytes, where installed and not yet imported, are stand-ins holding exactly the names those modules
   read while they load (`STAND_INS`). ``PeftModel`` is a class no object is an instance of until peft is imported (a
   ``PeftModel`` instance needs peft's class), and peft's class after that; every other name is peft's or
   bitsandbytes' own object, looked up at its first use, which imports the real package. The stand-ins leave
   ``sys.modules`` when the load ends, so a later ``import peft`` is peft.

A Colossal-AI that reads another name of peft or bitsandbytes while it loads, or subclasses ``PeftModel``, stops the
load with an ImportError naming it (the fix: `STAND_INS`), never a silent stand-in. tests/unit/distributed/
test_booster.py shows these rules on planted packages; tests/e2e/test_process_start.py, on Colossal-AI as pinned in a
fresh interpreter, that none of those packages loads, that the Booster trains and that LoRA through it still works.
"""

from __future__ import annotations

import importlib
import importlib.abc
import importlib.machinery
import importlib.metadata
import importlib.util
import sys
import types
from contextlib import contextmanager
from typing import TYPE_CHECKING, Any

STAND_INS = {
    "peft": ("PeftModel", "PeftType"),
    "peft.utils": (),
    "peft.utils.other": ("EMBEDDING_LAYER_NAMES", "check_file_exists_on_hf_hub"),
    "peft.utils.save_and_load": ("get_embedding_layer_name", "has_valid_embedding_base_layer"),
    "bitsandbytes": ("__version__",),
}
"""What Colossal-AI 0.5.0's Booster modules read of peft and bitsandbytes while they load, by module."""

CLASSES = ("peft.PeftModel",)
"""Names of `STAND_INS` that are classes checked with ``isinstance``."""

PACKAGES = {
    "colossalai.booster.plugin": (
        ("Plugin", "colossalai.booster.plugin.plugin_base"),
        ("TorchDDPPlugin", "colossalai.booster.plugin.torch_ddp_plugin"),
    ),
    "colossalai.booster": (
        ("Accelerator", "colossalai.booster.accelerator"),
        ("Booster", "colossalai.booster.booster"),
        ("Plugin", "colossalai.booster.plugin.plugin_base"),
    ),
}
"""Packages made without their ``__init__``, in this order, with the names loaded into them (name, its module)."""

NAMES = {
    "Booster": "colossalai.booster.booster",
    "DPPluginBase": "colossalai.booster.plugin.dp_plugin_base",
    "ModelWrapper": "colossalai.interface",
    "OptimizerWrapper": "colossalai.interface",
    "Plugin": "colossalai.booster.plugin.plugin_base",
    "TorchDDPPlugin": "colossalai.booster.plugin.torch_ddp_plugin",
}
"""The Colossal-AI classes this module hands out (``from vitlarge.distributed.booster import Booster``), by module:
the first one asked for runs `load`."""


_loading = False


def _colossalai() -> str:
    return f"Colossal-AI {importlib.metadata.version('colossalai')}"


class _StandIn(types.ModuleType):
    """peft, one of its submodules, or bitsandbytes while the Booster's modules load; after that, the real one's
    names at their first use."""

    def __getattr__(self, name: str):
        if name.startswith("__") and name.endswith("__"):
            raise AttributeError(name)
        if _loading:
            raise ImportError(
                f"{_colossalai()} reads {self.__name__}.{name} when it loads, which vitlarge's import of the Booster "
                "does not stand in for: add it to STAND_INS in vitlarge/distributed/booster.py"
            )
        return getattr(importlib.import_module(self.__name__), name)


def _loaded(module: str, name: str) -> Any | None:
    """``module.name`` of the real package where it is imported, else None."""
    found = sys.modules.get(module)
    return None if found is None or isinstance(found, _StandIn) else getattr(found, name)


def _real(module: str, name: str) -> Any:
    """``module.name`` of the real package, imported now if it is not."""
    found = _loaded(module, name)
    return getattr(importlib.import_module(module), name) if found is None else found


class _DeferredClass(type):
    """The type of a stand-in class: ``isinstance`` and ``issubclass`` against the real class once its package is
    imported (False before: nothing can be an instance then); any other use imports the package."""

    _module: str

    def __instancecheck__(cls, obj) -> bool:
        real = _loaded(cls._module, cls.__name__)
        return real is not None and isinstance(obj, real)

    def __subclasscheck__(cls, sub) -> bool:
        real = _loaded(cls._module, cls.__name__)
        return real is not None and issubclass(sub, real)

    def __getattr__(cls, name: str):
        if name.startswith("__") and name.endswith("__"):
            raise AttributeError(name)
        return getattr(_real(cls._module, cls.__name__), name)

    def __call__(cls, *args, **kwargs):
        return _real(cls._module, cls.__name__)(*args, **kwargs)


def _refuse_subclass(cls, **kwargs) -> None:
    raise ImportError(
        f"{_colossalai()} subclasses {cls.__mro__[1].__module__}.{cls.__mro__[1].__name__} when it loads, which "
        "vitlarge's stand-in cannot be: remove it from STAND_INS in vitlarge/distributed/booster.py"
    )


class _Deferred:
    """A name of peft or bitsandbytes that is not a class: the real object, looked up at its first use."""

    def __init__(self, module: str, name: str):
        self._module, self._name = module, name

    def _get(self) -> Any:
        return _real(self._module, self._name)

    def __getattr__(self, attr: str):
        if attr.startswith("__") and attr.endswith("__") or attr in ("_module", "_name"):
            raise AttributeError(attr)
        return getattr(self._get(), attr)

    def __call__(self, *args, **kwargs):
        return self._get()(*args, **kwargs)

    def __iter__(self):
        return iter(self._get())

    def __contains__(self, item) -> bool:
        return item in self._get()

    def __len__(self) -> int:
        return len(self._get())

    def __repr__(self) -> str:
        return f"<{self._module}.{self._name}, imported at its first use>"


class _StandInFinder(importlib.abc.MetaPathFinder, importlib.abc.Loader):
    """First on ``sys.meta_path`` while the Booster's modules load: the stand-ins of the packages ``tops``."""

    def __init__(self, tops: set[str]):
        self.tops = tops

    def find_spec(self, fullname, path, target=None):
        if fullname.split(".")[0] not in self.tops:
            return None
        if fullname not in STAND_INS:
            raise ImportError(
                f"{_colossalai()} imports {fullname} when it loads, which vitlarge's import of the Booster does not "
                "stand in for: add it to STAND_INS in vitlarge/distributed/booster.py"
            )
        return importlib.machinery.ModuleSpec(fullname, self, is_package=True)

    def create_module(self, spec):
        module = _StandIn(spec.name)
        for name in STAND_INS[spec.name]:
            if name == "__version__":  # what Colossal-AI compares, from the installed distribution's metadata
                setattr(module, name, importlib.metadata.version(spec.name.split(".")[0]))
            elif f"{spec.name}.{name}" in CLASSES:
                attrs = {"_module": spec.name, "__module__": spec.name, "__init_subclass__": _refuse_subclass}
                setattr(module, name, _DeferredClass(name, (), attrs))
            else:
                setattr(module, name, _Deferred(spec.name, name))
        return module

    def exec_module(self, module) -> None:
        pass


@contextmanager
def _stand_ins():
    """peft and bitsandbytes as stand-ins (where installed and not imported yet) inside the block."""
    global _loading
    tops = {
        top
        for top in {name.split(".")[0] for name in STAND_INS}
        if top not in sys.modules and importlib.util.find_spec(top) is not None
    }
    finder = _StandInFinder(tops)
    sys.meta_path.insert(0, finder)
    _loading = True
    try:
        yield
    finally:
        _loading = False
        sys.meta_path.remove(finder)
        for name in [n for n, m in sys.modules.items() if isinstance(m, _StandIn)]:
            del sys.modules[name]


def package_without_init(name: str) -> types.ModuleType:
    """The package ``name``, in ``sys.modules`` and on its parent, without its ``__init__`` run; reading a name it
    does not hold runs its ``__init__`` (once) and returns that name."""
    spec = importlib.util.find_spec(name)
    assert spec is not None and spec.loader is not None, name
    package = importlib.util.module_from_spec(spec)
    loader = spec.loader

    def __getattr__(attr: str):
        if attr.startswith("__") and attr.endswith("__") and attr != "__all__":
            raise AttributeError(f"module {name!r} has no attribute {attr!r}")
        vars(package).pop("__getattr__", None)
        loader.exec_module(package)  # the rest of the package's names (its __init__ imports every plugin)
        try:
            return vars(package)[attr]
        except KeyError:
            raise AttributeError(f"module {name!r} has no attribute {attr!r}") from None

    vars(package)["__getattr__"] = __getattr__  # PEP 562: called for a name the package does not hold
    sys.modules[name] = package
    parent, _, child = name.rpartition(".")
    if parent:
        setattr(sys.modules[parent], child, package)
    return package


def load() -> None:
    """Imports the Booster, its DDP plugin and the bases `vitlarge.distributed.fsdp` builds on, as the module docstring
    says (once; nothing to do where ``colossalai.booster`` is already imported)."""
    if "colossalai.booster" in sys.modules:
        return
    import colossalai  # noqa: F401  # lazy: keeps Colossal-AI off the GPU kit, which imports package_without_init alone

    with _stand_ins():
        packages = {name: package_without_init(name) for name in ("colossalai.booster", "colossalai.booster.plugin")}
        for package, names in PACKAGES.items():
            for name, module in names:
                setattr(packages[package], name, getattr(importlib.import_module(module), name))
        for module in NAMES.values():
            importlib.import_module(module)


def __getattr__(name: str):
    if name not in NAMES:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    load()
    value = getattr(importlib.import_module(NAMES[name]), name)
    globals()[name] = value
    return value


if TYPE_CHECKING:
    from colossalai.booster import Booster
    from colossalai.booster.plugin import Plugin, TorchDDPPlugin
    from colossalai.booster.plugin.dp_plugin_base import DPPluginBase
    from colossalai.interface import ModelWrapper, OptimizerWrapper

__all__ = [
    "Booster",
    "DPPluginBase",
    "ModelWrapper",
    "OptimizerWrapper",
    "Plugin",
    "TorchDDPPlugin",
    "load",
    "package_without_init",
]
