rule report:
    """One markdown summary with every evaluation's per-bucket table and plots."""
    input:
        eval_targets(),
    output:
        "results/report/summary.md",
    conda:
        "../envs/genolc.yaml"
    log:
        "logs/report/report.log",
    params:
        out=lambda wc, output: os.path.dirname(output[0]),
        python=shlex.quote(sys.executable),
    shell:
        "{params.python} -m genolc.eval.report --out {params.out:q} {input:q} > {log:q} 2>&1"
