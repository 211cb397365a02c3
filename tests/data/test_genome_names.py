"""Chromosome aliases, primary-chromosome filter, name resolution and header parsing (regions, NCBI, Ensembl)."""

from __future__ import annotations

import pytest

from genolc.data.genome import canonical_chrom, is_primary, open_genome, parse_header, resolve_chroms
from genolc.errors import InputError


@pytest.mark.parametrize(
    "alias, expected",
    [
        ("chr22", "chr22"),
        ("22", "chr22"),
        ("CHR22", "chr22"),
        ("Chr22", "chr22"),
        ("NC_000022.11", "chr22"),
        ("NC_000022", "chr22"),
        ("NC_000001.11", "chr1"),
        ("NC_000023.10", "chrX"),
        ("NC_000024.10", "chrY"),
        ("NC_012920.1", "chrM"),
        ("MT", "chrM"),
        ("M", "chrM"),
        ("chrMT", "chrM"),
        ("x", "chrX"),
        ("chrY", "chrY"),
        ("gi|224589822|ref|NC_000023.10|", "chrX"),
        ("gi|57116681|ref|NC_000962.2|", "NC_000962.2"),
        ("NC_000962.2", "NC_000962.2"),
        ("NC_000025.1", "NC_000025.1"),
        ("chr01", "chr01"),
        ("K-12-MG1655", "K-12-MG1655"),
        ("chr1_KI270706v1_random", "chr1_KI270706v1_random"),
        (" chr7 ", "chr7"),
    ],
)
def test_canonical_chrom(alias, expected):
    assert canonical_chrom(alias) == expected


@pytest.mark.parametrize(
    "chrom, primary",
    [
        ("chr1", True),
        ("chrX", True),
        ("chrM", True),
        ("K-12-MG1655", True),
        ("NC_000962.2", True),
        ("chr01", True),
        ("chr1_KI270706v1_random", False),
        ("chr6_GL000250v2_alt", False),
        ("chrUn_KI270302v1", False),
        ("chr1_KN196472v1_fix", False),
        ("chr6_apd_hap1", False),
        ("chr6_cox_hap2", False),
        ("chrEBV", False),
        ("hs37d5", False),
        ("chrUn_JTFH01000001v1_decoy", False),
        ("HLA-A*01:01:01:01", False),
        ("GL000192.1", False),
        ("KI270711.1", False),
        ("NT_187361.1", False),
    ],
)
def test_is_primary(chrom, primary):
    assert is_primary(chrom) is primary


def test_resolve_chroms_aliases_and_order():
    available = ["chrX", "chr22", "chr2", "chr1"]
    assert resolve_chroms(["1", "NC_000002.12", "CHR22", "X", "chr1"], available) == ["chr1", "chr2", "chr22", "chrX"]
    assert resolve_chroms("chr2, 22", available) == ["chr2", "chr22"]
    # available names that are themselves aliases are matched through their canonical form
    assert resolve_chroms(["chr22"], ["22", "X"]) == ["22"]


def test_resolve_chroms_unknown_lists_close_matches():
    with pytest.raises(InputError) as err:
        resolve_chroms(["chr23"], ["chr2", "chr22", "chrX"])
    message = str(err.value)
    assert "unknown chromosome 'chr23'" in message
    assert "close matches" in message and "chr22" in message
    assert err.value.fix


@pytest.mark.parametrize(
    "header, name, chrom, start",
    [
        ("22:20000001-21000000", "22:20000001-21000000", "chr22", 20000001),
        ("chr3 42000000 44000000", "chr3", "chr3", 42000000),
        ("chr16 186964 397118 +", "chr16", "chr16", 186964),
        ("X  gi|224589822|ref|NC_000023.10|", "X", "chrX", 1),
        (" chr22", "chr22", "chr22", 1),
        ("chr13:75,549,820-75,605,809", "chr13:75,549,820-75,605,809", "chr13", 75549820),
        ("1 dna:chromosome chromosome:GRCh37:1:1:249250621:1", "1", "chr1", 1),
        ("7 dna:chromosome chromosome:GRCh38:7:5000001:6000000:1", "7", "chr7", 5000001),
        ("NC_000022.11 Homo sapiens chromosome 22, GRCh38.p14 Primary Assembly", "NC_000022.11", "chr22", 1),
        # contig-relative region: chromosome from the text, start stays in the record's own frame
        (
            "gi|568802167|ref|NT_011295.12|:18775270-19883859 Homo sapiens chromosome 19 genomic scaffold, "
            "GRCh38.p12 Primary Assembly HSCHR19_CTG2",
            "gi|568802167|ref|NT_011295.12|:18775270-19883859",
            "chr19",
            1,
        ),
        # NCBI unlocalized scaffolds, alternate loci and patches keep their accession (and are not primary)
        ("NT_187361.1 Homo sapiens chromosome 1 unlocalized genomic scaffold, GRCh38.p14 Primary Assembly "
         "HSCHR1_CTG1_UNLOCALIZED", "NT_187361.1", "NT_187361.1", 1),
        ("NT_187633.1 Homo sapiens chromosome 1 genomic scaffold, GRCh38.p14 alternate locus group ALT_REF_LOCI_1 "
         "HSCHR1_1_CTG3", "NT_187633.1", "NT_187633.1", 1),
        ("NW_025791756.1 Homo sapiens chromosome 1 genomic patch of type NOVEL, GRCh38.p14 PATCHES HG2095_PATCH",
         "NW_025791756.1", "NW_025791756.1", 1),
        # a contig region with no chromosome text keeps the contig as its chromosome and the region start
        ("NT_011295.12:100-200", "NT_011295.12:100-200", "NT_011295.12", 100),
        # yeast chromosome X (= 10) must not become human chrX
        ("chr10 BK006943.2 TPA: Saccharomyces cerevisiae S288c chromosome X.", "chr10", "chr10", 1),
        ("NC_001142.9 Saccharomyces cerevisiae S288C chromosome X, complete sequence", "NC_001142.9", "NC_001142.9", 1),
        # an impossible region is not a region
        ("chr5:200-100", "chr5:200-100", "chr5:200-100", 1),
        ("chr5 100 50", "chr5", "chr5", 1),
        ("chr9 0 1000", "chr9", "chr9", 1),
    ],
)
def test_parse_header(header, name, chrom, start):
    info = parse_header(3, header, "/x.fa")
    assert (info.name, info.chrom, info.start) == (name, chrom, start)
    assert info.description == header.strip()
    assert info.index == 3 and info.source == "/x.fa"


def test_real_headers(shared_file):
    """The messy headers as shipped resolve to the chromosomes the data README names."""
    cases = {
        "human/GRCh37_chrX_1-69999930.fa.gz": [("X", "chrX", 1)],
        "human/GRCh37_chr22_20000001-21000000.fa.gz": [("22:20000001-21000000", "chr22", 20000001)],
        "human/hg19_chr3_42000000-44000000.fa.gz": [("chr3", "chr3", 42000000)],
        "human/GRCh37_chr1_truncated_240kb.fa.gz": [("1", "chr1", 1)],
        "human/GRCh38p12_chr19_NT_011295.12_18775270-19883859.fa.gz": [
            ("gi|568802167|ref|NT_011295.12|:18775270-19883859", "chr19", 1)
        ],
        "other/Mtb_H37Rv_NC_000962.2.fa.gz": [("gi|57116681|ref|NC_000962.2|", "NC_000962.2", 1)],
    }
    for relative, expected in cases.items():
        got = [(s.info.name, s.info.chrom, s.info.start) for s in open_genome(shared_file(relative)).records()]
        assert got == expected, relative
