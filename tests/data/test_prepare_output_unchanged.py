"""`genolc prepare` writes, byte for byte, what it wrote before the speed work of issue 20 (main dd0cd30) on real
DNA: 83 Mbp (GRCh37 chrX with its N runs, soft-masked yeast, a chr22 piece cut at a held-out region) with the char
tokenizer, k-mers on yeast and an hg38 chr2 piece, BPE on a phage and the chr22 piece.

The md5s below were taken from that commit's output (every file but the run records; the manifest without its
fingerprint, genolc version and source paths, which name this checkout). A change that alters a byte of a dataset
fails here; if the change is meant, the format version moves and these md5s are retaken.
"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

import pytest

from genolc.data.prepare import PrepareConfig, prepare

CASES = {
    "char": dict(genomes=("human/GRCh37_chrX_1-69999930.fa.gz", "other/Scerevisiae_S288C_R64_16chr.fa.gz",
                          "human/GRCh37_chr22_20000001-21000000.fa.gz"),
                 train="all", heldout=("chr22:20200001-20400000",), tokenizer="char"),
    "kmer:6": dict(genomes=("other/Scerevisiae_S288C_R64_16chr.fa.gz", "human/hg38_chr2_1-2333275.fa.gz"),
                   train="all", heldout=("chr2:1000001-1200000",), tokenizer="kmer:6"),
    "bpe:256": dict(genomes=("other/lambda_phage_NC_001416.1.fa.gz", "human/GRCh37_chr22_20000001-21000000.fa.gz"),
                    train="all", heldout=("chr22:20200001-20400000",), tokenizer="bpe:256",
                    bpe_sample_bases=200_000),
}

MAIN_DD0CD30_MD5 = {
    "bpe:256": {
        ".genolc-output.json": "e461ba4c1127be116aa79da005fd67e5",
        "manifest.json minus fingerprint, version, sources": "ecadab919cc3f9705adcda8cebbb5cd7",
        "nruns/NC_001416.1.npy": "a8d26d7d8f7b9ad6015af688162784bf",
        "nruns/chr22_20000001-20200000.npy": "a8d26d7d8f7b9ad6015af688162784bf",
        "nruns/chr22_20200001-20400000.npy": "a8d26d7d8f7b9ad6015af688162784bf",
        "nruns/chr22_20400001-21000000.npy": "a6faae73746a96bde120407f236857de",
        "offsets/NC_001416.1.npy": "7ba7c7ab00357dcecdc91d3f6db84831",
        "offsets/chr22_20000001-20200000.npy": "f944b65dab8816565751c6964fb97427",
        "offsets/chr22_20200001-20400000.npy": "c174381872c9339ad1a1bd090c02607b",
        "offsets/chr22_20400001-21000000.npy": "32f3aea13edbff387be5a0a111dab6f5",
        "softmask/NC_001416.1.bits": "4ca3231aedf7b999b0165269bda90884",
        "softmask/chr22_20000001-20200000.bits": "9d3ea19f61d0ccda7326f0bf8103c95e",
        "softmask/chr22_20200001-20400000.bits": "9d3ea19f61d0ccda7326f0bf8103c95e",
        "softmask/chr22_20400001-21000000.bits": "594e16d7b91297aefe8157834c6d2d19",
        "tokenizer.json": "b6e371a9f7f369366860e0554f8aa242",
        "tokens/NC_001416.1.bin": "2407f099f90d911f8ab497c9e4c40fbd",
        "tokens/chr22_20000001-20200000.bin": "3a2702d6d8aca8122565cef672d0a87e",
        "tokens/chr22_20200001-20400000.bin": "8199b70938bc93d31aa59d77603a5155",
        "tokens/chr22_20400001-21000000.bin": "d53f9dbb3e667c129d6c4428d8a6e26e"
    },
    "char": {
        ".genolc-output.json": "e461ba4c1127be116aa79da005fd67e5",
        "manifest.json minus fingerprint, version, sources": "3c15840a29c4348b9b5418e6379ab8a4",
        "nruns/chr01.npy": "a8d26d7d8f7b9ad6015af688162784bf",
        "nruns/chr02.npy": "a8d26d7d8f7b9ad6015af688162784bf",
        "nruns/chr03.npy": "a8d26d7d8f7b9ad6015af688162784bf",
        "nruns/chr04.npy": "a8d26d7d8f7b9ad6015af688162784bf",
        "nruns/chr05.npy": "a8d26d7d8f7b9ad6015af688162784bf",
        "nruns/chr06.npy": "a8d26d7d8f7b9ad6015af688162784bf",
        "nruns/chr07.npy": "a8d26d7d8f7b9ad6015af688162784bf",
        "nruns/chr08.npy": "a8d26d7d8f7b9ad6015af688162784bf",
        "nruns/chr09.npy": "a8d26d7d8f7b9ad6015af688162784bf",
        "nruns/chr10.npy": "a8d26d7d8f7b9ad6015af688162784bf",
        "nruns/chr11.npy": "a8d26d7d8f7b9ad6015af688162784bf",
        "nruns/chr12.npy": "a8d26d7d8f7b9ad6015af688162784bf",
        "nruns/chr13.npy": "a8d26d7d8f7b9ad6015af688162784bf",
        "nruns/chr14.npy": "a8d26d7d8f7b9ad6015af688162784bf",
        "nruns/chr15.npy": "a8d26d7d8f7b9ad6015af688162784bf",
        "nruns/chr16.npy": "a8d26d7d8f7b9ad6015af688162784bf",
        "nruns/chr22_20000001-20200000.npy": "a8d26d7d8f7b9ad6015af688162784bf",
        "nruns/chr22_20200001-20400000.npy": "a8d26d7d8f7b9ad6015af688162784bf",
        "nruns/chr22_20400001-21000000.npy": "a6faae73746a96bde120407f236857de",
        "nruns/chrX.npy": "5200bcbadb9820cfe6352b274363090e",
        "softmask/chr01.bits": "a2b992d07fa42f7805acb21eedb655d9",
        "softmask/chr02.bits": "4716b8fb28eb99598829b06cfebc448b",
        "softmask/chr03.bits": "276bc6edd7972d04cf7f8a175909b921",
        "softmask/chr04.bits": "7bd3ce7bd20976c4f128d92c2c9a76f5",
        "softmask/chr05.bits": "b90531784329c3befc2309f8a8bb25c8",
        "softmask/chr06.bits": "3b77cb1bbdbbbddb258e619cfae5747d",
        "softmask/chr07.bits": "9f3dfcbb99c5aeb3396acfc42bfb5551",
        "softmask/chr08.bits": "f6dff6fed4275e8b24c1d8016ba0aacc",
        "softmask/chr09.bits": "435450da32460feb8a630f1744983291",
        "softmask/chr10.bits": "4ee5814858a5a0413e3664521d07a71a",
        "softmask/chr11.bits": "8b2123c42d77042133a9b109c60af79f",
        "softmask/chr12.bits": "4ec7271db6f1d5c6837b755a7dadc365",
        "softmask/chr13.bits": "3c1f3dafcc1783ec3964c2aaa2cc0547",
        "softmask/chr14.bits": "6f32835b904a40e6eb9f765cf891dcad",
        "softmask/chr15.bits": "73a3ffb56e9a8b1f23bc87e6e8eac363",
        "softmask/chr16.bits": "eb23c1f04780f6827ccca91d9f9d63cb",
        "softmask/chr22_20000001-20200000.bits": "9d3ea19f61d0ccda7326f0bf8103c95e",
        "softmask/chr22_20200001-20400000.bits": "9d3ea19f61d0ccda7326f0bf8103c95e",
        "softmask/chr22_20400001-21000000.bits": "594e16d7b91297aefe8157834c6d2d19",
        "softmask/chrX.bits": "ba3a886ea9d21402c9a6f3108139d341",
        "tokenizer.json": "03cf09735d00099a3f1c51cf9c08c4ac",
        "tokens/chr01.bin": "b30e7fafcbe5c85652686098e66aca8f",
        "tokens/chr02.bin": "96c94d2707ef1a1ac42c13a2810a726c",
        "tokens/chr03.bin": "01d544042f1f769293da41de40842bab",
        "tokens/chr04.bin": "52cb184f9469cc4fb4cda9a4de3cf35f",
        "tokens/chr05.bin": "fa0a7e7d814632457186b6529ca7aeed",
        "tokens/chr06.bin": "8e6dd3cfb06ea0ff78bbc843c9c3824d",
        "tokens/chr07.bin": "ff497e891cd1797e001343b4544bf5de",
        "tokens/chr08.bin": "8de981c1dd9614dc05844a410505869b",
        "tokens/chr09.bin": "6471fdece1943c88911fc16375bea295",
        "tokens/chr10.bin": "98a8a513e4755328489dd5ed4944e8ab",
        "tokens/chr11.bin": "f1844dc6ca032685fb23e46f79a9fa6a",
        "tokens/chr12.bin": "df59b1a20a10674fb28e5ff54ceae63d",
        "tokens/chr13.bin": "827c7d8d36aad814214f1d0854b3af92",
        "tokens/chr14.bin": "9e4bcc646a2c1090c684ed552f917663",
        "tokens/chr15.bin": "2b746bd76d7c2bedae8a400cb97d3195",
        "tokens/chr16.bin": "fff588429edab2dad8db0bb4dbfd24f7",
        "tokens/chr22_20000001-20200000.bin": "e3e77470bc7523d550a757d2f9fa06ce",
        "tokens/chr22_20200001-20400000.bin": "192028a2adf2d6be21a6d21810609cdd",
        "tokens/chr22_20400001-21000000.bin": "ce44b96786c1c7c08886c2e29ac16afa",
        "tokens/chrX.bin": "4a6289cc06640ed42a233d8e172eddba"
    },
    "kmer:6": {
        ".genolc-output.json": "e461ba4c1127be116aa79da005fd67e5",
        "manifest.json minus fingerprint, version, sources": "dcefc73d42cf53eae8601ca878639972",
        "nruns/chr01.npy": "a8d26d7d8f7b9ad6015af688162784bf",
        "nruns/chr02.npy": "a8d26d7d8f7b9ad6015af688162784bf",
        "nruns/chr03.npy": "a8d26d7d8f7b9ad6015af688162784bf",
        "nruns/chr04.npy": "a8d26d7d8f7b9ad6015af688162784bf",
        "nruns/chr05.npy": "a8d26d7d8f7b9ad6015af688162784bf",
        "nruns/chr06.npy": "a8d26d7d8f7b9ad6015af688162784bf",
        "nruns/chr07.npy": "a8d26d7d8f7b9ad6015af688162784bf",
        "nruns/chr08.npy": "a8d26d7d8f7b9ad6015af688162784bf",
        "nruns/chr09.npy": "a8d26d7d8f7b9ad6015af688162784bf",
        "nruns/chr10.npy": "a8d26d7d8f7b9ad6015af688162784bf",
        "nruns/chr11.npy": "a8d26d7d8f7b9ad6015af688162784bf",
        "nruns/chr12.npy": "a8d26d7d8f7b9ad6015af688162784bf",
        "nruns/chr13.npy": "a8d26d7d8f7b9ad6015af688162784bf",
        "nruns/chr14.npy": "a8d26d7d8f7b9ad6015af688162784bf",
        "nruns/chr15.npy": "a8d26d7d8f7b9ad6015af688162784bf",
        "nruns/chr16.npy": "a8d26d7d8f7b9ad6015af688162784bf",
        "nruns/chr2_1-1000000.npy": "093bc5b48eafde5c8187b827844cc276",
        "nruns/chr2_1000001-1200000.npy": "a8d26d7d8f7b9ad6015af688162784bf",
        "nruns/chr2_1200001-2333275.npy": "a8d26d7d8f7b9ad6015af688162784bf",
        "softmask/chr01.bits": "a2b992d07fa42f7805acb21eedb655d9",
        "softmask/chr02.bits": "4716b8fb28eb99598829b06cfebc448b",
        "softmask/chr03.bits": "276bc6edd7972d04cf7f8a175909b921",
        "softmask/chr04.bits": "7bd3ce7bd20976c4f128d92c2c9a76f5",
        "softmask/chr05.bits": "b90531784329c3befc2309f8a8bb25c8",
        "softmask/chr06.bits": "3b77cb1bbdbbbddb258e619cfae5747d",
        "softmask/chr07.bits": "9f3dfcbb99c5aeb3396acfc42bfb5551",
        "softmask/chr08.bits": "f6dff6fed4275e8b24c1d8016ba0aacc",
        "softmask/chr09.bits": "435450da32460feb8a630f1744983291",
        "softmask/chr10.bits": "4ee5814858a5a0413e3664521d07a71a",
        "softmask/chr11.bits": "8b2123c42d77042133a9b109c60af79f",
        "softmask/chr12.bits": "4ec7271db6f1d5c6837b755a7dadc365",
        "softmask/chr13.bits": "3c1f3dafcc1783ec3964c2aaa2cc0547",
        "softmask/chr14.bits": "6f32835b904a40e6eb9f765cf891dcad",
        "softmask/chr15.bits": "73a3ffb56e9a8b1f23bc87e6e8eac363",
        "softmask/chr16.bits": "eb23c1f04780f6827ccca91d9f9d63cb",
        "softmask/chr2_1-1000000.bits": "55de591517a8369efc6dd655718323b2",
        "softmask/chr2_1000001-1200000.bits": "edce73abc72573123811c227d8647988",
        "softmask/chr2_1200001-2333275.bits": "3a408fd85190d90dce8a8c2b50814893",
        "tokenizer.json": "a560d17df60275db173a87ceddf146aa",
        "tokens/chr01.bin": "3e53834f38d5678decde41f46462b074",
        "tokens/chr02.bin": "e14b47395ff279ddd58a1e3e45b953b4",
        "tokens/chr03.bin": "1549e42f2a5d2cb87f0f886042a323e4",
        "tokens/chr04.bin": "67d4eb5a75aa77a4f533244d2ed7e0e1",
        "tokens/chr05.bin": "2acc2a5b4970fe6e43e91f7784a036ad",
        "tokens/chr06.bin": "242e93c26b8fee5c6f2b5b7b5f9b205d",
        "tokens/chr07.bin": "197e56a4f0d867b188bc307711c0a855",
        "tokens/chr08.bin": "b7e584fad518c3abec0a8881ddca85ef",
        "tokens/chr09.bin": "ac23cb841f680a6894fbeb781eccd4c6",
        "tokens/chr10.bin": "a998d041f4c00fad14682506ac6031b5",
        "tokens/chr11.bin": "0ebba111fc510169ddd6bf9be8158e12",
        "tokens/chr12.bin": "c78a26ff98c870b4fee4615f5ab89053",
        "tokens/chr13.bin": "8018b559fd800e79077e877ff3bb7d0e",
        "tokens/chr14.bin": "92dc1bf9752711e3db22e9fbda9c9629",
        "tokens/chr15.bin": "3a8105c50ba2cd6d508cc87336dd6088",
        "tokens/chr16.bin": "ccffaed9cddb0b1b956c02597af90c85",
        "tokens/chr2_1-1000000.bin": "02c04d7160f7ca2fbcc42177693f73af",
        "tokens/chr2_1000001-1200000.bin": "a33879b98df6836798e5f2ec35cbc9bf",
        "tokens/chr2_1200001-2333275.bin": "22c061ef2f1a772b5bd0f056659c677c"
    }
}


def _md5s(root: Path) -> dict[str, str]:
    files = {}
    for path in sorted(root.rglob("*")):
        relative = path.relative_to(root)
        if path.is_file() and "runs" not in relative.parts and relative.name != "manifest.json":
            files[str(relative)] = hashlib.md5(path.read_bytes()).hexdigest()
    manifest = json.loads((root / "manifest.json").read_text())
    for key in ("fingerprint", "genolc_version", "sources"):
        manifest.pop(key, None)
    files["manifest.json minus fingerprint, version, sources"] = hashlib.md5(
        json.dumps(manifest, sort_keys=True).encode()).hexdigest()
    return files


@pytest.mark.parametrize("tokenizer", sorted(CASES))
def test_prepare_writes_what_main_wrote(tokenizer, shared_file, tmp_path):
    case = dict(CASES[tokenizer])
    genomes = tuple(shared_file(g) for g in case.pop("genomes"))
    out = prepare(PrepareConfig(genomes=genomes, out=tmp_path / "ds", all_records=True, force=True, progress=False,
                                **case))
    assert _md5s(out) == MAIN_DD0CD30_MD5[tokenizer]
