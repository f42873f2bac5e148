"""Flax models of the seed papers, a registry by name, and one adapter for user linen/nnx models.

Example: ``make_model("cnn", 10)``; ``register_model("mynet", MyNet)``; ``ModelAdapter.from_nnx(factory)``;
``build_model(lambda rngs: MyNet(rngs=rngs), num_classes=10)``.
"""

from jaxfl.models.adapter import ModelAdapter, as_adapter
from jaxfl.models.cifar import VGG, VGG11, VGG16, AlexNet, ResNet20
from jaxfl.models.cnn import MLP, CCFedAvgCNN, CCFedAvgMLP, ExampleCNN, FedASMUCNN, LeNet5, LogReg, MnistCNN
from jaxfl.models.resnet import BasicBlock, ResNet18, ResNet18GN
from jaxfl.models.text import LSTMClassifier, TextCNN
from jaxfl.models.zoo import (MODEL_INPUTS, MODELS, TEXT_MODELS, InputSpec, build_model, check_model_input,
                              check_model_object, count_params, is_model_reference, load_model_reference, make_model,
                              models_for, register_model, user_label)

__all__ = [
    "AlexNet", "MLP", "MODELS", "MODEL_INPUTS", "TEXT_MODELS", "BasicBlock", "CCFedAvgCNN", "CCFedAvgMLP",
    "ExampleCNN", "FedASMUCNN", "InputSpec", "LSTMClassifier", "LeNet5", "LogReg", "MnistCNN", "ModelAdapter",
    "ResNet18", "ResNet18GN", "ResNet20", "TextCNN", "VGG", "VGG11", "VGG16", "as_adapter", "build_model",
    "check_model_input", "check_model_object", "count_params", "is_model_reference", "load_model_reference",
    "make_model", "models_for", "register_model", "user_label",
]
