"""Training: offline corpus (``data``), optax training with an MTP loss and orbax
resume (``train``)."""

from mtpspec.training.data import build_manifest, load_corpus
from mtpspec.training.train import TrainConfig, evaluate, losses, train

__all__ = [
    "TrainConfig",
    "build_manifest",
    "evaluate",
    "load_corpus",
    "losses",
    "train",
]
