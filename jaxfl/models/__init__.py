"""Flax models of the seed papers, a registry by name, and one adapter for user linen/nnx models.

Example: ``make_model("cnn", 10)``; ``register_model("mynet", MyNet)``; ``ModelAdapter.from_nnx(factory)``.
"""

from jaxfl.models.adapter import ModelAdapter, as_adapter
from jaxfl.models.cnn import MLP, CCFedAvgCNN, CCFedAvgMLP, ExampleCNN, FedASMUCNN, LeNet5, LogReg, MnistCNN
from jaxfl.models.resnet import BasicBlock, ResNet18, ResNet18GN
from jaxfl.models.text import LSTMClassifier, TextCNN
from jaxfl.models.zoo import (MODEL_INPUTS, MODELS, TEXT_MODELS, InputSpec, check_model_input, count_params,
                              make_model, models_for, register_model)

__all__ = [
    "MLP", "MODELS", "MODEL_INPUTS", "TEXT_MODELS", "BasicBlock", "CCFedAvgCNN", "CCFedAvgMLP", "ExampleCNN", "FedASMUCNN",
    "InputSpec", "LSTMClassifier", "LeNet5", "LogReg", "MnistCNN", "ModelAdapter", "ResNet18", "ResNet18GN",
    "TextCNN", "as_adapter", "check_model_input", "count_params", "make_model", "models_for", "register_model",
]
