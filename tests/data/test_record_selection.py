"""Which records go to which split, on its own (genolc/data/record_selection.py): the defaults, held-out regions,
one decision per record as prepare's single pass meets it, and the report of queries that matched nothing."""

from __future__ import annotations

import pytest

from genolc.data.genome import RecordInfo, canonical_chrom
from genolc.data.record_selection import (ALL, RecordSelector, Region, check_selection, parse_region, parse_split,
                                          split_queries)
from genolc.errors import ConfigError, InputError


def _info(name: str, index: int = 0) -> RecordInfo:
    return RecordInfo(index=index, name=name, description=name, chrom=canonical_chrom(name), start=1,
                      source="genome.fa")


def test_defaults_never_take_what_the_other_option_names():
    assert split_queries(None, None) == (("chr1", "chr2"), ("chr22",))
    assert split_queries(None, ("2",)) == (("chr1",), ("2",))
    assert split_queries(("chr3",), None) == (("chr3",), ("chr22",))
    with pytest.raises(ConfigError, match="--train takes the default held-out chromosome"):
        split_queries(("22", "chr3"), None)
    assert split_queries(ALL, None) == (ALL, ("chr22",))
    with pytest.raises(ConfigError, match="both default training chromosomes"):
        split_queries(None, ("chr1", "chr2"))


def test_cli_text_to_queries():
    assert parse_split(None, "--train") is None and parse_split(" all ", "--train") == ALL
    assert parse_split("none", "--heldout") == () and parse_split("chr1, chr2,", "--train") == ("chr1", "chr2")
    with pytest.raises(ConfigError, match="reads as two"):
        parse_split("chr2R:1-5,000", "--heldout")


def test_regions_and_names_that_look_like_them():
    assert parse_region("chr2R:1-5000") == Region("chr2R:1-5000", "chr2R", 1, 5000)
    assert parse_region("chr22") is None and parse_region("NC_000022.11") is None
    for bad, why in (("chr2R:5-", "not a region"), ("chr2R:0-10", "1-based"), ("chr2R:9-3", "starts after")):
        with pytest.raises(ConfigError, match=why):
            parse_region(bad)


def test_each_record_gets_one_split_and_its_regions():
    selector = RecordSelector(("chr1",), ("chr22", "chr2:101-200", "chr2:1-50"), all_records=False)
    assert selector.plan(_info("chr1"), "chr1") == ("train", [])
    assert selector.plan(_info("22"), "chr22") == ("heldout", [])
    split, regions = selector.plan(_info("chr2"), "chr2")
    assert split == "unused" and [r.start for r in regions] == [1, 101]      # sorted; the rest of chr2 unused
    assert selector.plan(_info("chrUn_gl000220"), "chrUn_gl000220") == ("unused", [])
    assert selector.unmatched(("chr1", "chr5")) == ["chr5"]
    everything = RecordSelector(ALL, ("chr22",), all_records=False)
    assert everything.plan(_info("chr3"), "chr3") == ("train", [])
    assert everything.plan(_info("chr3_random"), "chr3_random") == ("unused", [])
    assert RecordSelector(ALL, (), all_records=True).plan(_info("chr3_random"), "chr3_random") == ("train", [])


def test_a_record_in_both_splits_is_refused():
    with pytest.raises(ConfigError, match="selected both for training .* and as held out") as error:
        RecordSelector(("chr1",), ("1",), all_records=False).plan(_info("chr1"), "chr1")
    assert "--heldout NAME:START-END" in error.value.fix
    with pytest.raises(ConfigError, match="held out whole .* and in part"):
        RecordSelector(("chr1",), ("chr2", "chr2:1-9"), all_records=False).plan(_info("chr2"), "chr2")
    with pytest.raises(ConfigError, match="overlap"):
        RecordSelector(("chr1",), ("chr2:1-9", "chr2:5-20"), all_records=False).plan(_info("chr2"), "chr2")


def test_queries_that_matched_nothing_are_reported_with_the_records_found():
    records = [{"name": "chr1", "chrom": "chr1", "split": "train"},
               {"name": "chr2", "chrom": "chr2", "split": "unused"}]
    selector = RecordSelector(("chr1",), ("chr9",), all_records=False)
    for record in records:
        selector.plan(_info(record["name"]), record["name"])
    with pytest.raises(InputError, match="--heldout") as error:
        check_selection(selector, records, ("chr1",), ("chr9",), ("chr1",), ("chr9",))
    assert "chr1" in str(error.value) + error.value.fix
    quiet = RecordSelector(("chr1",), ("chr22",), all_records=False)
    for record in records:
        quiet.plan(_info(record["name"]), record["name"])
    with pytest.raises(InputError, match="the default --heldout chr22 is not among the records found: chr1, chr2"):
        check_selection(quiet, records, ("chr1",), None, ("chr1",), ("chr22",))
    check_selection(quiet, records, ("chr1",), (), ("chr1",), ())
    with pytest.raises(InputError, match="no record is selected for training"):
        check_selection(quiet, [dict(r, split="unused") for r in records], ("chr1",), (), ("chr1",), ())
