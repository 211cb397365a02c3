"""Importing the fla ops genolc calls without fla's package-wide imports.

``fla/__init__.py`` imports every fla layer and model (transformers among them) and ``fla/ops/__init__.py`` every
op's kernels, so ``from fla.ops.kda import chunk_kda`` took 20.5 s of a process with warm bytecode on the H200
(``python -X importtime``, benchmarks/results/fla_import_2026-12-02.json), paid inside every run's first training
step, for the one op genolc calls. :func:`import_fla_module` imports such a submodule with those two package
``__init__`` files left out: each of the packages not yet imported becomes a bare package module over fla's own
search path, so its submodules import as usual, carrying the one name fla's own modules read from ``fla``
(``__version__``). fla's other packages (``fla.modules``, ``fla.backends``, ...) initialise as usual. A process that
imported fla before keeps the packages it has; a failed import takes the bare ones back out.
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
    if spec is None or spec.submodule_search_locations is None:
        return None
    module = importlib.util.module_from_spec(spec)      # __path__, __spec__, __file__; the __init__ is not run
    if "." not in name:
        module.__version__ = _declared_version(spec.origin)
    return module


def import_fla_module(name: str, bare: tuple[str, ...] = BARE_PACKAGES) -> ModuleType:
    """``importlib.import_module(name)`` with the packages in ``bare`` (parents first) left uninitialised where
    this process has not imported them yet (module docstring). ModuleNotFoundError as the import's own when fla
    is not installed."""
    with _IMPORT_LOCK:
        return _import_with_bare_packages(name, bare)


def _import_with_bare_packages(name: str, bare: tuple[str, ...]) -> ModuleType:
    added: list[str] = []
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
        for package in reversed(added):
            sys.modules.pop(package, None)
        raise
