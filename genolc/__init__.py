"""genolc: long-context genomic language modeling."""

__version__ = "0.1.0"
