"""Helpers shared by the rules: genome files, run and eval lookups, checkpoint paths, config cross-checks."""

import shlex
import sys

from snakemake.exceptions import WorkflowError

from genolc.errors import GenolcError
from genolc.sample import sample_files
from genolc.units import parse_length


GENOLC = config.get("genolc") or f"{shlex.quote(sys.executable)} -m genolc.cli"


def _length(value, what, problems):
    """Tokens in ``value`` (512k, 4096), or None with the reason appended to ``problems``."""
    try:
        return parse_length(value, what=what)
    except GenolcError as exc:
        problems.append(exc.message)
        return None


def _cross_check(cfg):
    """What the JSON schema cannot say: names that refer to each other, and lengths genolc can read."""
    problems = []
    for run, spec in cfg["runs"].items():
        if spec["genome_set"] not in cfg["genome_sets"]:
            problems.append(f"runs.{run} uses unknown genome_set {spec['genome_set']!r}")
        _length(spec["seq"], f"runs.{run}.seq", problems)
    for name, spec in cfg["evals"].items():
        for role in ("run", "baseline"):
            other = spec.get(role)
            if other is not None and other not in cfg["runs"]:
                problems.append(f"evals.{name} names unknown {role} {other!r}")
        run = cfg["runs"].get(spec["run"])
        genome_set = cfg["genome_sets"].get(run["genome_set"]) if run else None
        if spec.get("baseline") in cfg["runs"] and run is not None:
            if cfg["runs"][spec["baseline"]]["genome_set"] != run["genome_set"]:
                problems.append(f"evals.{name}: baseline and run were trained on different genome sets")
        if genome_set is not None:
            unknown = [c for c in spec["heldout"] if c not in genome_set["heldout"]]
            if unknown:
                problems.append(f"evals.{name}.heldout {unknown} is not among genome set {run['genome_set']!r}'s "
                                f"heldout {genome_set['heldout']}")
        seq = _length(spec["seq"], f"evals.{name}.seq", problems)
        for k in spec.get("contexts", []):
            context = _length(k, f"evals.{name}.contexts", problems)
            if seq is not None and context is not None and not 1 <= context < seq:
                problems.append(f"evals.{name}.contexts {k} must be shorter than its seq {spec['seq']}")
    if problems:
        # WorkflowError: Snakemake prints it as one message, without a Python traceback.
        where = ", ".join(map(str, workflow.configfiles)) or "the config"
        raise WorkflowError(f"invalid workflow config ({where}):\n- " + "\n- ".join(problems)
                            + "\nFix these entries and run again.")


_cross_check(config)


def genome_files(genome_set):
    files = config["genome_sets"][genome_set]["files"]
    return [str(p) for p in sample_files()] if files == "bundled" else list(files)


def run_genome_set(run):
    return config["runs"][run]["genome_set"]


def final_checkpoint(run):
    """The trainer names checkpoints by completed steps; the final one is step-<steps>."""
    return f"results/runs/{run}/checkpoints/step-{int(config['runs'][run]['steps']):06d}"


def eval_targets():
    return [f"results/eval/{name}/{chrom}" for name, spec in config["evals"].items() for chrom in spec["heldout"]]


def comma(items):
    return ",".join(str(i) for i in items)
