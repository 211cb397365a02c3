"""Run SkyRL 0.4.0's own config classes and pretokenized loader on a genolc export; print a JSON report.

Runs in a separate environment holding SkyRL's source (never genolc's: SkyRL pins an older transformers), e.g.::

    GENOLC_SKYRL_PYTHON=/tmp/skyrl-env/bin/python GENOLC_SKYRL_SRC=/tmp/skyrl/src python -m pytest tests/export

Usage: python skyrl_check.py EXPORT_DIR
"""

import json
import sys
from pathlib import Path

import yaml
from omegaconf import OmegaConf

from skyrl.train.config.sft_config import SFTConfig, validate_sft_cfg

export = Path(sys.argv[1])
raw = yaml.safe_load((export / "skyrl_sft.yaml").read_text())
cfg = SFTConfig.from_dict_config(OmegaConf.create(raw))
validate_sft_cfg(cfg)
report = {
    "strategy": cfg.strategy,
    "tp": cfg.megatron_config.tensor_model_parallel_size,
    "cp": cfg.megatron_config.context_parallel_size,
    "ep": cfg.megatron_config.expert_model_parallel_size,
    "recompute": cfg.megatron_config.transformer_config_kwargs["recompute_granularity"],
    "paths": cfg.pretokenized_dataset_paths,
}
try:
    from skyrl.train.dataset.pretokenized import load_from_pretokenized
except ImportError as exc:  # the loader needs `datasets`; the config check above does not
    report["loader"] = f"unavailable: {exc}"
else:
    dataset = load_from_pretokenized(cfg.pretokenized_dataset_paths[0], max_length=cfg.max_length)
    rows = [dataset[i] for i in range(len(dataset))]
    report["loader"] = "ok"
    report["rows"] = [{"input_ids": list(map(int, r["input_ids"])), "num_actions": int(r["num_actions"]),
                       "loss_mask": list(map(int, r["loss_mask"]))} for r in rows]
print(json.dumps(report))
