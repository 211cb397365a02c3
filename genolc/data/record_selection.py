"""Which records of the genome files go to which split: `genolc prepare`'s ``--train`` and ``--heldout`` queries.

A query matches a record by its name, its canonical chromosome or an alias of it (genolc.data.genome). A held-out
query may be a region, ``NAME:START-END`` (1-based, inclusive, chromosome coordinates, as samtools writes them):
that stretch of the record is held out and the rest of it goes where the record would otherwise go. Because
prepare reads its inputs in one pass, :class:`RecordSelector` decides each record's split as it arrives and
remembers which queries matched; :func:`check_selection` then reports the ones that matched nothing, with close
matches, before anything is written.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field

from genolc.data import genome
from genolc.errors import ConfigError, InputError

ALL = "all"
DEFAULT_TRAIN = ("chr1", "chr2")
DEFAULT_HELDOUT = ("chr22",)


def parse_split(text: str | None, option: str) -> tuple[str, ...] | str | None:
    """CLI text -> split queries: None stays None (default), 'all' -> 'all', 'none' -> (), 'a,b' -> ('a', 'b')."""
    if text is None:
        return None
    value = text.strip()
    if value.lower() == ALL:
        if option == "--heldout":
            raise ConfigError("--heldout all would leave nothing to train on", fix="name the held-out records")
        return ALL
    if value.lower() == "none":
        if option == "--train":
            raise ConfigError("--train none leaves nothing to train on", fix="name the training records or use all")
        return ()
    queries = tuple(q.strip() for q in value.split(",") if q.strip())
    if not queries:
        raise ConfigError(f"{option} is empty", fix=f"name records, e.g. {option} chr22")
    for previous, query in zip(queries, queries[1:]):
        if query.isdigit() and ":" in previous:
            raise ConfigError(f"{option} {value!r}: commas separate records, so {previous},{query} reads as two",
                              fix="write region coordinates without thousands separators, e.g. chr2R:1-5000000")
    return queries


@dataclass(frozen=True)
class Region:
    """A held-out region: record ``name`` (or alias), bases ``start..end`` (1-based, inclusive, chromosome
    coordinates: a record whose header carries a region starts at its own ``start``, as BED files and evaluation
    outputs count). ``query`` is the text as given."""

    query: str
    name: str
    start: int
    end: int

    def overlaps(self, other: "Region") -> bool:
        return self.start <= other.end and other.start <= self.end


_REGION_SHAPED = re.compile(r"(?P<name>.+):(?P<span>[^:]*-[^:]*)")
_REGION_SPAN = re.compile(r"(?P<start>[0-9]+)-(?P<end>[0-9]+)")
_REGION_FIX = "write NAME:START-END with 1-based inclusive coordinates, e.g. chr2R:1-5000000"


def parse_region(query: str) -> Region | None:
    """``NAME:START-END`` -> :class:`Region`; None for a record name (no ``:…-…`` with digits after the last colon).

    A query that looks like a region but is not a valid one (``chr2R:5-``, ``chr2R:0-10``, ``chr2R:9-3``) is a
    ConfigError. A record whose own name has that shape (``>22:20000001-21000000``) is still matched whole by it.
    """
    shaped = _REGION_SHAPED.fullmatch(query.strip())
    if shaped is None or not any(c.isdigit() for c in shaped["span"]):
        return None
    span = _REGION_SPAN.fullmatch(shaped["span"].strip())
    if span is None:
        raise ConfigError(f"--heldout {query!r} is not a region", fix=_REGION_FIX)
    start, end = int(span["start"]), int(span["end"])
    if start < 1:
        raise ConfigError(f"--heldout {query!r}: coordinates are 1-based, so a region starts at base 1 or later",
                          fix=_REGION_FIX)
    if start > end:
        raise ConfigError(f"--heldout {query!r}: the region starts after it ends", fix=_REGION_FIX)
    return Region(query=query, name=shaped["name"].strip(), start=start, end=end)


def check_regions_disjoint(regions: list[Region], same_record=None) -> None:
    """ConfigError for two regions that overlap on one record (``same_record``: by canonical name when None)."""
    same = same_record or (lambda a, b: genome.canonical_chrom(a.name) == genome.canonical_chrom(b.name))
    for i, a in enumerate(regions):
        for b in regions[i + 1:]:
            if same(a, b) and a.overlaps(b):
                raise ConfigError(f"--heldout regions {a.query} and {b.query} overlap",
                                  fix="merge them into one region, or make them disjoint")


def query_matches(query: str, info: genome.RecordInfo, key: str) -> bool:
    if query in (info.name, info.chrom, key):
        return True
    alias = genome.canonical_chrom(query)
    return alias in (info.chrom, genome.canonical_chrom(info.name))


@dataclass
class RecordSelector:
    """Per-record split decisions for one pass, remembering which queries matched something."""

    train: tuple[str, ...] | str
    heldout: tuple[str, ...]
    all_records: bool
    matched: dict[str, set[str]] = field(default_factory=dict)

    def plan(self, info: genome.RecordInfo, key: str) -> tuple[str, list[Region]]:
        """(split of the record, or of what is left of it around its regions; its held-out regions, sorted)."""
        held, regions = [], []
        for query in self.heldout:
            if query_matches(query, info, key):
                held.append(query)
            elif (region := parse_region(query)) is not None and query_matches(region.name, info, key):
                regions.append(region)
        named_train = [] if self.train == ALL else [q for q in self.train if query_matches(q, info, key)]
        for q in held + named_train + [r.query for r in regions]:
            self.matched.setdefault(q, set()).add(key)
        if held and named_train:
            raise ConfigError(
                f"record {info.name!r} ({info.chrom}) is selected both for training (by {named_train[0]!r}) "
                f"and as held out (by {held[0]!r})",
                where=info.source,
                fix="a held-out chromosome must not be in train; change --train or --heldout "
                    "(or hold out a region of it: --heldout NAME:START-END)",
            )
        if held and regions:
            raise ConfigError(
                f"record {info.name!r} ({info.chrom}) is held out whole (by {held[0]!r}) and in part "
                f"(by {regions[0].query!r})", where=info.source, fix="give one of them in --heldout")
        regions.sort(key=lambda r: r.start)
        check_regions_disjoint(regions, same_record=lambda a, b: True)
        if held:
            return "heldout", []
        if named_train:
            return "train", regions
        if self.train == ALL and (self.all_records or genome.is_primary(info.chrom)):
            return "train", regions
        return "unused", regions

    def unmatched(self, queries: tuple[str, ...] | str) -> list[str]:
        return [] if queries == ALL else [q for q in queries if q not in self.matched]


def check_queries_disjoint(train: tuple[str, ...] | str | None, heldout: tuple[str, ...] | None) -> None:
    if not train or not heldout or train == ALL:
        return
    both = {genome.canonical_chrom(q) for q in train} & {genome.canonical_chrom(q) for q in heldout}
    if both:
        raise ConfigError(
            f"{', '.join(sorted(both))} is both in --train and --heldout",
            fix="a held-out chromosome must not be in train; remove it from one of them",
        )


def split_queries(train_option: tuple[str, ...] | str | None, heldout_option: tuple[str, ...] | None
                  ) -> tuple[tuple[str, ...] | str, tuple[str, ...]]:
    """The queries for each split from ``--train`` and ``--heldout`` (None: not given), defaults filled in; a default
    never takes what the other option names."""
    canon = genome.canonical_chrom
    if train_option is None:
        held = {canon(q) for q in heldout_option or ()}
        train: tuple[str, ...] | str = tuple(q for q in DEFAULT_TRAIN if canon(q) not in held)
        if not train:
            raise ConfigError(f"--heldout takes both default training chromosomes ({', '.join(DEFAULT_TRAIN)})",
                              fix="name the training records with --train")
    else:
        train = train_option
    if heldout_option is None:
        named = set() if train == ALL else {canon(q) for q in train}
        heldout = tuple(q for q in DEFAULT_HELDOUT if canon(q) not in named)
        if not heldout:
            raise ConfigError(f"--train takes the default held-out chromosome ({', '.join(DEFAULT_HELDOUT)})",
                              fix="name another record with --heldout, or pass --heldout none")
    else:
        heldout = heldout_option
    return train, heldout


def records_listing(found: list[dict]) -> str:
    shown = [f"{r['name']} ({r['chrom']})" if r["name"] != r["chrom"] else r["name"] for r in found[:30]]
    more = f" and {len(found) - 30} more" if len(found) > 30 else ""
    return ", ".join(shown) + more


def check_selection(selector: RecordSelector, records: list[dict], train_option: tuple[str, ...] | str | None,
                    heldout_option: tuple[str, ...] | None, train_q: tuple[str, ...] | str,
                    heldout_q: tuple[str, ...]) -> None:
    """After the pass: an InputError for a query the user gave that matched no record (with the closest names), a
    default that matched none, or no record selected for training."""
    found = [{"name": r["name"], "chrom": r["chrom"]} for r in records]
    available = list(dict.fromkeys([r["chrom"] for r in records] + [r["name"] for r in records]))
    for option, given, queries in (("--train", train_option, train_q), ("--heldout", heldout_option, heldout_q)):
        missing = selector.unmatched(queries)
        if not missing:
            continue
        if given is None:
            matched_any = any(q in selector.matched for q in queries)
            if not matched_any:
                raise InputError(
                    f"the default {option} {','.join(queries)} is not among the records found: "
                    f"{records_listing(found)}",
                    fix=f"name the records with {option} (e.g. {option} {found[0]['chrom'] if found else 'chr1'})"
                    + (", or --heldout none" if option == "--heldout" else ", or --train all"),
                )
            continue
        if option == "--train" and any(_REGION_SHAPED.fullmatch(q) for q in missing):
            raise InputError(f"--train {', '.join(missing)} matches no record; --train takes whole records",
                             fix="to keep a region of a record out of training, name the record in --train and "
                                 "the region in --heldout NAME:START-END")
        # A region's record is named by the part before its coordinates.
        names = [region.name if (region := parse_region(q)) is not None else q for q in missing]
        # The genome module owns alias resolution; its error lists the closest names. Say which option it was.
        try:
            genome.resolve_chroms(names, available)
        except InputError as exc:
            raise InputError(f"{option}: {exc.what}", where=exc.where, fix=exc.fix) from None
        raise InputError(
            f"{option} {', '.join(missing)} matches no record", fix=f"records found: {records_listing(found)}"
        )
    if not any(r["split"] == "train" for r in records):
        raise InputError(
            "no record is selected for training",
            fix=f"records found: {records_listing(found)}; use --train (or --all-records for non-primary ones)",
        )
