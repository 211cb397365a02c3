"""import_fla_module: a submodule of a package whose __init__ files are expensive, imported without running them.

A stand-in package on disk (fla is not installed on the CPU machines): its top-level and ``ops`` __init__ files
record that they ran, as fla's import every layer, model and op."""

from __future__ import annotations

import sys

import pytest

from genolc.model.ops.kda.fla_import import import_fla_module


@pytest.fixture
def stand_in(tmp_path, monkeypatch):
    root = tmp_path / "heavy"
    (root / "ops" / "kda").mkdir(parents=True)
    (root / "__init__.py").write_text("__import__('builtins').HEAVY_RAN.append('heavy')\n__version__ = '9.1'\n")
    (root / "ops" / "__init__.py").write_text("__import__('builtins').HEAVY_RAN.append('heavy.ops')\n")
    (root / "ops" / "kda" / "__init__.py").write_text(
        "from heavy.ops.kda.chunk import chunk_kda\nfrom heavy import __version__\n")
    (root / "ops" / "kda" / "chunk.py").write_text("def chunk_kda():\n    return 'kernel'\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    import builtins
    monkeypatch.setattr(builtins, "HEAVY_RAN", [], raising=False)
    yield builtins.HEAVY_RAN
    for name in [name for name in sys.modules if name == "heavy" or name.startswith("heavy.")]:
        del sys.modules[name]


def test_the_submodule_imports_without_its_packages_init(stand_in):
    module = import_fla_module("heavy.ops.kda", bare=("heavy", "heavy.ops"))
    assert module.chunk_kda() == "kernel" and module.__version__ == "9.1"
    assert stand_in == []
    assert sys.modules["heavy"].ops is sys.modules["heavy.ops"]


def test_packages_already_imported_are_kept(stand_in):
    import heavy

    import_fla_module("heavy.ops.kda", bare=("heavy", "heavy.ops"))
    assert stand_in == ["heavy"] and sys.modules["heavy"] is heavy


def test_a_name_the_package_exports_runs_its_init_then(stand_in, tmp_path):
    """transformers' fla-backed layers or a user's code may ask fla itself for what its __init__ exports."""
    (tmp_path / "heavy" / "ops" / "__init__.py").write_text(
        "__import__('builtins').HEAVY_RAN.append('heavy.ops')\nfrom heavy.ops.kda.chunk import chunk_kda as exported\n")
    import_fla_module("heavy.ops.kda", bare=("heavy", "heavy.ops"))
    assert stand_in == []
    from heavy.ops import exported

    assert exported() == "kernel" and stand_in == ["heavy.ops"]
    assert sys.modules["heavy.ops"].kda.chunk_kda is exported
    with pytest.raises(ImportError, match="cannot import name 'missing'"):
        from heavy import missing  # noqa: F401
    assert stand_in == ["heavy.ops", "heavy"]


def test_a_failed_import_takes_the_bare_packages_back_out(stand_in, tmp_path):
    (tmp_path / "heavy" / "ops" / "kda" / "chunk.py").write_text("raise ImportError('no kernels')\n")
    with pytest.raises(ImportError, match="no kernels"):
        import_fla_module("heavy.ops.kda", bare=("heavy", "heavy.ops"))
    assert not [name for name in sys.modules if name == "heavy" or name.startswith("heavy.")]
    import heavy.ops  # noqa: F401  (a later ordinary import runs both __init__ files)
    assert stand_in == ["heavy", "heavy.ops"]


def test_a_package_that_is_not_installed_is_the_imports_own_error():
    with pytest.raises(ModuleNotFoundError):
        import_fla_module("not_installed_package.ops.kda", bare=("not_installed_package", "not_installed_package.ops"))
