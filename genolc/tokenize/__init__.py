"""Genome tokenizers: char, non-overlapping k-mer, BPE (trained on DNA) and byte-level, behind one interface.

See docs/internals.md ("Tokenizers") for the contract and each module's docstring for its id layout.
"""

from genolc.tokenize.base import (ASCII_COMPLEMENT, SPECIAL_TOKENS, Tokenizer, as_bases,
                                  reverse_complement_bases)
from genolc.tokenize.bpe import BPETokenizer
from genolc.tokenize.byte import ByteTokenizer
from genolc.tokenize.char import CharTokenizer
from genolc.tokenize.factory import (TOKENIZER_KINDS, load_tokenizer, make_tokenizer, save_tokenizer,
                                     tokenizer_from_dict)
from genolc.tokenize.kmer import KmerTokenizer

__all__ = [
    "ASCII_COMPLEMENT", "SPECIAL_TOKENS", "TOKENIZER_KINDS", "BPETokenizer", "ByteTokenizer", "CharTokenizer",
    "KmerTokenizer", "Tokenizer", "as_bases", "load_tokenizer", "make_tokenizer", "reverse_complement_bases",
    "save_tokenizer", "tokenizer_from_dict",
]
