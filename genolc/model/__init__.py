"""The GLM-5.3-Flash text decoder for genome language modeling (weight-compatible with transformers' glm5_next)."""

from genolc.model.checkpoint import convert_checkpoint, load_pretrained, save_pretrained, write_checkpoint
from genolc.model.config import ModelConfig
from genolc.model.model import GenomeLM, ModelOutput, build_model, resize_vocab
from genolc.model.presets import parameter_counts, preset

__all__ = ["GenomeLM", "ModelConfig", "ModelOutput", "build_model", "convert_checkpoint", "load_pretrained",
           "parameter_counts", "preset", "resize_vocab", "save_pretrained", "write_checkpoint"]
