"""Flax models. Example: ``make_model("cnn", 10)``."""

from jaxfl.models.cnn import MLP, MODELS, MnistCNN, count_params, make_model

__all__ = ["MLP", "MODELS", "MnistCNN", "count_params", "make_model"]
