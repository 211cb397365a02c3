rule finetune:
    """Fine-tune one run's model on its genome set's training chromosomes."""
    input:
        manifest=lambda wc: f"results/prepared/{run_genome_set(wc.run)}/manifest.json",
    output:
        summary="results/runs/{run}/summary.json",
    conda:
        "../envs/genolc.yaml"
    log:
        "logs/finetune/{run}.log",
    params:
        data=lambda wc, input: os.path.dirname(input.manifest),
        out=lambda wc, output: os.path.dirname(output.summary),
        seq=lambda wc: config["runs"][wc.run]["seq"],
        steps=lambda wc: config["runs"][wc.run]["steps"],
        start=lambda wc: (
            f"--init {shlex.quote(config['runs'][wc.run]['init'])}"
            if config["runs"][wc.run].get("init")
            else f"--model {shlex.quote(config['runs'][wc.run].get('model', 'tiny'))}"
        ),
        options=lambda wc: " ".join(
            f"--{name} {config['runs'][wc.run][name]}" for name in ("lr", "seed") if name in config["runs"][wc.run]
        ),
        extra=lambda wc: config["runs"][wc.run].get("extra_args", ""),
        genolc=GENOLC,
    resources:
        gpu=lambda wc: config["runs"][wc.run].get("gpu", 1),
    shell:
        "{params.genolc} finetune --data {params.data:q} --out {params.out:q} --seq {params.seq} "
        "--steps {params.steps} {params.start} {params.options} {params.extra} --no-progress > {log:q} 2>&1"
