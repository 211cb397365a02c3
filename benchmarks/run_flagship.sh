#!/usr/bin/env bash
# bash benchmarks/run_flagship.sh [EXPERIMENT OPTIONS...]   (on the H200, from the repository root;
#                                                           carry: [".gpu", ".gpudata"])
# The flagship experiment (experiments/long_context_dna.py, issue 15) on the real human pieces in .gpudata/ (made by
# `python benchmarks/make_gpu_data.py`): trains on the GRCh37 chrX 1-24 Mbp prefix and hg38 chr2:1-2,333,275, holds
# out GRCh37 chr22, hg19 chr3/chr4/chr5 and GRCh38 chr19 (8.1 Mbp). Unpacks the GPU packages and the carried caches
# (fla/Triton autotune results, TileLang's compiled kernels) as run_long_context.sh does; OPTIONS go to the
# experiment (e.g. --preset mini --jobs 2 --time-budget 540 --compile-seconds 0 --eval-tokens 1M, the run in the
# README; --gpus 0,1 on nvidia-h200-x2). $OUT receives four files:
# <date>_long_context_dna.tar.gz (the results folder), flagship.log, triton-autotune.tar.gz, tilelang-cache.tar.gz.
# GENOLC_GIT_SHA must be set by the caller (the device copy has no .git).
set -uo pipefail
source benchmarks/gpu_env.sh
gpu_env_setup || exit 1
nvidia-smi --query-gpu=index,name,memory.total --format=csv,noheader | tee "$OUT/flagship.log"
name="$(date -u +%F)_long_context_dna"
D=.gpudata
# SIGINT before the device's 600 s limit: the experiment stops its phases and prints each phase's last lines into
# flagship.log (what it ran, how far it got), where a kill would leave nothing to read. 560 s: set-up (~10 s), the
# 15 s grace and packing the caches still end inside 600; --time-budget 540 plans for 486 s.
timeout -s INT -k 15 "${FLAGSHIP_TIMEOUT:-560}" python3 experiments/long_context_dna.py \
    --train-fasta "$D/GRCh37_chrX_1-24000000.fa.gz" --train-fasta "$D/hg38_chr2_1-2333275.fa.gz" \
    --heldout-fasta "$D/GRCh37_chr22_20000001-21000000.fa.gz" \
    --heldout-fasta "$D/hg19_chr3_42000000-44000000.fa.gz" --heldout-fasta "$D/hg19_chr4_103000000-105000000.fa.gz" \
    --heldout-fasta "$D/hg19_chr5_124000000-126000000.fa.gz" \
    --heldout-fasta "$D/GRCh38p12_chr19_NT_011295.12_18775270-19883859.fa.gz" \
    --train chrX,chr2 --heldout chr22,chr3,chr4,chr5,chr19 \
    --out "/tmp/flagship/$name" --archive "$OUT/$name.tar.gz" "$@" 2>&1 | tee -a "$OUT/flagship.log"
rc=${PIPESTATUS[0]}
gpu_env_pack_caches
exit $rc
