rule prepare:
    """Tokenize one genome set into a prepared dataset (memmap tokens, masks, manifest)."""
    input:
        lambda wc: genome_files(wc.genome_set),
    output:
        manifest="results/prepared/{genome_set}/manifest.json",
    conda:
        "../envs/genolc.yaml"
    log:
        "logs/prepare/{genome_set}.log",
    params:
        out=lambda wc, output: os.path.dirname(output.manifest),
        train=lambda wc: comma(config["genome_sets"][wc.genome_set]["train"]),
        heldout=lambda wc: comma(config["genome_sets"][wc.genome_set]["heldout"]) or "none",
        tokenizer=lambda wc: config["genome_sets"][wc.genome_set].get("tokenizer", "char"),
        genolc=GENOLC,
    shell:
        "{params.genolc} prepare {input:q} --out {params.out:q} --train {params.train:q} "
        "--heldout {params.heldout:q} --tokenizer {params.tokenizer:q} > {log:q} 2>&1"
