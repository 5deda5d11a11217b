"""Training: offline corpus and your own text (``data``), a base model with its MTP head or a fresh
one (``heads``), the losses, one MTP depth or a chain (``losses``), optax training and orbax
resume (``train``)."""

from mtpspec.training.data import build_manifest, load_corpus, load_text
from mtpspec.training.heads import load_base
from mtpspec.training.losses import losses
from mtpspec.training.train import TrainConfig, evaluate, train

__all__ = [
    "TrainConfig",
    "build_manifest",
    "evaluate",
    "load_base",
    "load_corpus",
    "load_text",
    "losses",
    "train",
]
