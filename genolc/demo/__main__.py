"""``python -m genolc.demo init``: the demo's first checkpoint, for replaying the demo command by command."""

from genolc.demo.pipeline import main

main()
