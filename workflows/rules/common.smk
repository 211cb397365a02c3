"""Helpers shared by the rules: genome files, run and eval lookups, checkpoint paths, config cross-checks."""

import shlex
import sys

from genolc.sample import sample_files
from genolc.units import parse_length


GENOLC = config.get("genolc") or f"{shlex.quote(sys.executable)} -m genolc.cli"


def _cross_check(cfg):
    """What the JSON schema cannot say: names that must refer to each other."""
    problems = []
    for run, spec in cfg["runs"].items():
        if spec["genome_set"] not in cfg["genome_sets"]:
            problems.append(f"run {run!r} uses unknown genome_set {spec['genome_set']!r}")
        parse_length(spec["seq"], what=f"runs.{run}.seq")
    for name, spec in cfg["evals"].items():
        for role in ("run", "baseline"):
            other = spec.get(role)
            if other is not None and other not in cfg["runs"]:
                problems.append(f"eval {name!r} names unknown {role} {other!r}")
        if spec.get("baseline") in cfg["runs"] and spec["run"] in cfg["runs"]:
            if cfg["runs"][spec["baseline"]]["genome_set"] != cfg["runs"][spec["run"]]["genome_set"]:
                problems.append(f"eval {name!r}: baseline and run were trained on different genome sets")
        parse_length(spec["seq"], what=f"evals.{name}.seq")
    if problems:
        raise ValueError("invalid workflow config: " + "; ".join(problems))


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
