"""Hand-off to distributed trainers: genolc prepares the data, the config and the launch; SkyRL or Megatron-core
trains; genolc evaluates the checkpoint they write (transformers layout).

- :mod:`genolc.export.rows`: a sampler window as a training row (token ids and a 0/1 loss mask).
- :mod:`genolc.export.skyrl`: ``genolc export --format skyrl``, rows as SkyRL's pretokenized SFT Parquet.
- :mod:`genolc.export.layout`: the memory model that picks tensor/context/expert parallel sizes.
- :mod:`genolc.export.skyrl_config`: the SkyRL SFT config for GLM-5.3-Flash, and running SkyRL's SFT entry point.
- :mod:`genolc.export.megatron`: Megatron-core model-provider arguments and a map-style dataset over a prepared
  dataset (``genolc export --format megatron`` writes the arguments; the data is read in place).
"""
