rule eval:
    """Score a run's final checkpoint on one held-out chromosome, by position, with baseline and context controls."""
    input:
        summary=lambda wc: f"results/runs/{config['evals'][wc.name]['run']}/summary.json",
        baseline=lambda wc: (
            [f"results/runs/{config['evals'][wc.name]['baseline']}/summary.json"]
            if config["evals"][wc.name].get("baseline")
            else []
        ),
        manifest=lambda wc: f"results/prepared/{run_genome_set(config['evals'][wc.name]['run'])}/manifest.json",
    output:
        directory("results/eval/{name}/{chrom}"),
    conda:
        "../envs/genolc.yaml"
    log:
        "logs/eval/{name}/{chrom}.log",
    params:
        data=lambda wc, input: os.path.dirname(input.manifest),
        checkpoint=lambda wc: final_checkpoint(config["evals"][wc.name]["run"]),
        seq=lambda wc: config["evals"][wc.name]["seq"],
        controls=lambda wc: " ".join(
            ([f"--baseline {final_checkpoint(config['evals'][wc.name]['baseline'])}"]
             if config["evals"][wc.name].get("baseline") else [])
            + [f"--context {k}" for k in config["evals"][wc.name].get("contexts", [])]
            + ([f"--max-windows {config['evals'][wc.name]['max_windows']}"]
               if "max_windows" in config["evals"][wc.name] else [])
        ),
        extra=lambda wc: config["evals"][wc.name].get("extra_args", ""),
        genolc=GENOLC,
    resources:
        gpu=lambda wc: config["evals"][wc.name].get("gpu", 1),
    shell:
        "{params.genolc} eval --by-position {wildcards.chrom:q} --data {params.data:q} "
        "--checkpoint {params.checkpoint:q} --seq {params.seq} {params.controls} {params.extra} "
        "--no-progress --out {output:q} > {log:q} 2>&1"
