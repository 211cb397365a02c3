"""Importing the fla ops genolc calls without fla's package-wide imports.

``fla/__init__.py`` imports every fla layer and model (transformers among them) and ``fla/ops/__init__.py`` every
op's kernels, so ``from fla.ops.kda import chunk_kda`` took 20.5 s of a process with warm bytecode on the H200
(``python -X importtime``, benchmarks/results/fla_import_2026-12-02.json), paid inside every run's first training
step, for the one op genolc calls. :func:`import_fla_module` imports such a submodule with those two package
``__init__`` files left out: each of the packages not yet imported becomes a bare package module over fla's own
search path, so its submodules import as usual, carrying the one name fla's own modules read from ``fla``
(``__version__``). Any other name asked of a bare package (``from fla import GatedDeltaNet``, ``from fla.ops
import chunk_gla``: transformers' fla-backed layers, a user's code in the same process) runs its ``__init__``
then, so nothing fla exports goes missing. fla's other packages (``fla.modules``, ``fla.backends``, ...)
initialise as usual. A process that imported fla before keeps the packages it has; a failed import takes out the
bare packages and every fla module it brought in.
"""

from __future__ import annotations

import importlib
import importlib.util
import re
import sys
import threading
from types import ModuleType

BARE_PACKAGES = ("fla", "fla.ops")
_VERSION = re.compile(r"""^__version__\s*=\s*["']([^"']+)["']""", re.M)
# The kernel warm-up's threads and the step import fla ops at once: one set of bare packages, put in or taken out
# whole.
_IMPORT_LOCK = threading.RLock()


def _declared_version(init_file: str | None) -> str:
    try:
        with open(init_file or "", encoding="utf-8") as source:
            found = _VERSION.search(source.read())
    except OSError:
        found = None
    return found.group(1) if found else "0"


def _bare_package(name: str) -> ModuleType | None:
    spec = importlib.util.find_spec(name)
    if spec is None or spec.submodule_search_locations is None or spec.loader is None:
        return None
    module = importlib.util.module_from_spec(spec)      # __path__, __spec__, __file__; the __init__ is not run
    if "." not in name:
        module.__version__ = _declared_version(spec.origin)

    def initialise_then_get(attribute: str):
        # Module-level __getattr__ (PEP 562): only names the module lacks come here. Removed first, so the
        # __init__ it runs sees an ordinary module.
        with _IMPORT_LOCK:
            if vars(module).pop("__getattr__", None) is not None:
                spec.loader.exec_module(module)
        try:
            return vars(module)[attribute]
        except KeyError:
            raise AttributeError(f"module {name!r} has no attribute {attribute!r}") from None

    module.__getattr__ = initialise_then_get
    return module


def import_fla_module(name: str, bare: tuple[str, ...] = BARE_PACKAGES) -> ModuleType:
    """``importlib.import_module(name)`` with the packages in ``bare`` (parents first) left uninitialised where
    this process has not imported them yet (module docstring). ModuleNotFoundError as the import's own when fla
    is not installed."""
    with _IMPORT_LOCK:
        return _import_with_bare_packages(name, bare)


def _import_with_bare_packages(name: str, bare: tuple[str, ...]) -> ModuleType:
    added: list[str] = []
    before = set(sys.modules)
    try:
        for package in bare:
            if package in sys.modules:
                continue
            module = _bare_package(package)
            if module is None:
                break
            sys.modules[package] = module
            added.append(package)
            parent, _, child = package.rpartition(".")
            if parent:
                setattr(sys.modules[parent], child, module)
        return importlib.import_module(name)
    except BaseException:
        if added:
            # Modules imported under the bare packages belong to them (attributes of a package object about to go).
            for module_name in set(sys.modules) - before:
                if module_name == added[0] or module_name.startswith(added[0] + "."):
                    sys.modules.pop(module_name, None)
        raise
