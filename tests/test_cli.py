"""The command index: every listed command imports, carries the listed name and has working --help."""

from __future__ import annotations

import importlib
import subprocess
import sys

import pytest
from click.testing import CliRunner

from genolc.cli import COMMANDS, main


@pytest.mark.parametrize("name", sorted(COMMANDS))
def test_each_command_loads_under_its_name_and_prints_help(name):
    module, attribute, _ = COMMANDS[name]
    command = getattr(importlib.import_module(module), attribute)
    assert command.name == name
    result = CliRunner().invoke(main, [name, "--help"])
    assert result.exit_code == 0, result.output
    assert "Usage: " in result.output


def test_top_level_help_does_not_import_torch():
    code = "import sys; from genolc.cli import main; sys.argv=['genolc','--help']\ntry: main()\nexcept SystemExit: pass\nprint('torch' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip().splitlines()[-1] == "False"


def test_unknown_command_is_a_usage_error():
    result = CliRunner().invoke(main, ["prepar"])
    assert result.exit_code == 2
    assert "No such command" in result.output
