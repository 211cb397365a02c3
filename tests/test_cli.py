"""The command index (every listed command imports under its name, with working --help) and the command-line surface:
the frozen option list, help text for every option, and one spelling for options commands share."""

from __future__ import annotations

import importlib
import json
import signal
import subprocess
import sys
from pathlib import Path

import click
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


def test_ctrl_c_during_start_up_is_one_line_and_exit_130(tmp_path):
    """A real SIGINT while a command is being imported (start-up), and a KeyboardInterrupt inside a command that
    does not handle it: one 'interrupted' line and exit code 130, not click's 'Aborted!' and exit code 1."""
    code = ("import importlib, os, signal, sys\n"
            "real = importlib.import_module\n"
            "def slow_start(name, *args):\n"
            "    if name.startswith('genolc.') and name.endswith('command'):\n"
            "        os.kill(os.getpid(), signal.SIGINT)\n"
            "    return real(name, *args)\n"
            "importlib.import_module = slow_start\n"
            "from genolc.cli import main\n"
            "sys.argv = ['genolc', 'runs', 'ls', sys.argv[1]]\n"
            "main()\n")
    # A background job's shell starts its children with SIGINT ignored, which Python then keeps: undo that.
    done = subprocess.run([sys.executable, "-c", code, str(tmp_path)], capture_output=True, text=True,
                          preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))
    assert done.returncode == 130, done.stderr
    assert done.stderr.strip() == "genolc: interrupted (Ctrl-C)" and "Aborted" not in done.stdout + done.stderr

    import genolc.runs_command

    def interrupted(*args, **kwargs):
        raise KeyboardInterrupt

    original = genolc.runs_command.find_records
    genolc.runs_command.find_records = interrupted
    try:
        result = CliRunner().invoke(main, ["runs", "ls", str(tmp_path)])
    finally:
        genolc.runs_command.find_records = original
    assert result.exit_code == 130 and result.output.strip() == "genolc: interrupted (Ctrl-C)"


def test_unknown_command_is_a_usage_error():
    result = CliRunner().invoke(main, ["prepar"])
    assert result.exit_code == 2
    assert "No such command" in result.output


# tests/cli_options.json lists every command's options and arguments as `--help` spells them ("-o, --out",
# "--progress / --no-progress"; "(hidden)" marks a deprecated alias kept working but not shown). Adding, removing or
# respelling one is a deliberate change: update the list in the same commit (the failure prints the entry to paste).
CLI_OPTIONS = Path(__file__).with_name("cli_options.json")


def _command(name: str) -> click.Command:
    module, attribute, _ = COMMANDS[name]
    return getattr(importlib.import_module(module), attribute)


def _listed(param: click.Parameter, ctx: click.Context) -> bool:
    if isinstance(param, click.Argument):
        return bool(param.get_usage_pieces(ctx))
    return not param.hidden


def _spelling(param: click.Parameter, ctx: click.Context) -> str:
    if isinstance(param, click.Argument):
        text = param.name.upper()
    else:
        text = ", ".join(sorted(param.opts, key=len))
        if param.secondary_opts:
            text += " / " + ", ".join(param.secondary_opts)
    return text if _listed(param, ctx) else f"{text} (hidden)"


def _surface(name: str) -> list[str]:
    command = _command(name)
    ctx = click.Context(command, info_name=name)
    return [_spelling(param, ctx) for param in command.params]


def test_every_command_option_is_in_the_frozen_list():
    frozen = json.loads(CLI_OPTIONS.read_text())
    assert sorted(frozen) == sorted(COMMANDS), (
        f"commands changed: add or remove their entries in {CLI_OPTIONS.name} (genolc.cli.COMMANDS: "
        f"{sorted(COMMANDS)})")
    for name in sorted(COMMANDS):
        current = _surface(name)
        added, removed = set(current) - set(frozen[name]), set(frozen[name]) - set(current)
        assert not added and not removed, (
            f"`genolc {name}` options changed (added {sorted(added)}, removed {sorted(removed)}); if intended, "
            f"update {CLI_OPTIONS.name}: {json.dumps(name)}: {json.dumps(current)}")


@pytest.mark.parametrize("name", sorted(COMMANDS))
def test_every_option_has_help_and_every_argument_is_described(name):
    command = _command(name)
    ctx = click.Context(command, info_name=name)
    for param in command.params:
        if isinstance(param, click.Option):
            assert param.help and param.help.strip(), f"genolc {name} {param.opts[0]} has no help text"
        elif _listed(param, ctx):
            assert param.name.upper() in command.help, f"genolc {name}'s help does not describe {param.name.upper()}"
    assert "Example" in command.help, f"genolc {name} --help shows no example"


@pytest.mark.parametrize("name", sorted(COMMANDS))
def test_shared_options_are_spelled_alike(name):
    """--out has -o, progress bars are --progress/--no-progress, and --seq never hides a default length."""
    command = _command(name)
    options = {opt: param for param in command.params if isinstance(param, click.Option)
               for opt in param.opts + param.secondary_opts}
    if "--out" in options:
        assert "-o" in options["--out"].opts
    progress = [p for p in command.params if isinstance(p, click.Option) and not p.hidden
                and any("progress" in o or o == "--quiet" for o in p.opts + p.secondary_opts)]
    for param in progress:
        assert (param.opts, param.secondary_opts) == (["--progress"], ["--no-progress"])
        assert param.to_info_dict()["default"] is True
    if "--seq" in options:
        seq = options["--seq"]
        # Required where the user chooses the window; the demo alone plans its own sizes and takes --seq as an
        # override of that plan.
        assert seq.to_info_dict()["default"] is None and seq.required == (name != "demo")


def test_eval_help_says_one_of_by_position_or_needle_is_required_and_convert_help_has_an_example():
    eval_help = CliRunner().invoke(main, ["eval", "--help"]).output
    assert "Exactly one of --by-position, --needle and --routing is required" in " ".join(eval_help.split())
    convert_help = CliRunner().invoke(main, ["convert", "--help"]).output
    assert "genolc convert " in convert_help.split("Example")[1]


def test_deprecated_spellings_still_work_but_say_so(tmp_path):
    result = CliRunner().invoke(main, ["eval", "--quiet", "--by-position", "chr22", "--needle", "--data",
                                       str(tmp_path), "--checkpoint", str(tmp_path), "--seq", "1k"])
    assert "--quiet is deprecated; use --no-progress" in result.stderr
    assert "exactly one of" in result.stderr and result.exit_code == 2
    result = CliRunner().invoke(main, ["convert", str(tmp_path / "nowhere"), str(tmp_path / "dst")])
    assert "use `genolc convert SRC --out DST`" in result.stderr
    assert "checkpoint directory not found" in result.stderr and result.exit_code == 2
    result = CliRunner().invoke(main, ["convert", str(tmp_path), str(tmp_path / "a"), "--out", str(tmp_path / "b")])
    assert result.exit_code == 2 and "give the destination once" in result.output
    result = CliRunner().invoke(main, ["convert", str(tmp_path)])
    assert result.exit_code == 2 and "Missing option '-o' / '--out'" in result.output


def test_help_describes_held_out_regions_chunking_and_which_output_directories_are_taken():
    def help_of(name):
        return " ".join(CliRunner().invoke(main, [name, "--help"]).output.split())

    prepare_help = help_of("prepare")
    assert "A region NAME:START-END (1-based, inclusive" in prepare_help
    assert "genolc prepare dm6_chr2R.fa.gz --out data/dm --train chr2R --heldout chr2R:1-5000000" in prepare_help
    assert "--chunk auto|off|LENGTH" in help_of("finetune")
    for name in ("prepare", "finetune", "eval", "convert", "demo"):
        assert "new, empty or an earlier" in help_of(name), f"genolc {name} --out does not say which directories"
