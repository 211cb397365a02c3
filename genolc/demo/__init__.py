"""``genolc demo``: the whole pipeline (prepare, finetune, eval, report) on the real human sample bundled with
genolc."""
