"""Fusion inside known containers whose forward is not a Sequential's: torchvision's ResNet (stem, BasicBlock,
Bottleneck) and SqueezeExcitation (containers_torchvision.py), the feed-forward and output blocks of Hugging Face's
BERT and RoBERTa, the MLP of its ViT, and the convolution layers and residual blocks of its ResNet
(containers_transformers.py).

Each gets a forward installed on the instance that computes exactly what the class's forward computes, with each
convolution or Linear running as one kernel call with its BatchNorm folded in and what follows it (ReLU, GELU, the
residual add) as post-ops. The installed forward is only taken for the exact classes named here (a subclass may
have changed the forward), in eval mode without autograd; otherwise the class's own forward runs. A fused call the
kernel does not take runs as its modules.
"""

from __future__ import annotations

from torch import nn

from ember._optimize.inference import containers_torchvision as torchvision
from ember._optimize.inference import containers_transformers as transformers
from ember._optimize.inference.container_parts import is_class


def fuse_known_containers(model: nn.Module, conv_bn_folding: bool) -> list[str]:
    """Installs the fused forwards on every known container of ``model``; returns the class name of each. Inner
    containers come first (a residual layer builds on the forward of its last convolution layer)."""
    done: list[str] = []
    for module in reversed(list(model.modules())):
        if "forward" in module.__dict__:
            continue
        forward: object | None = None
        if conv_bn_folding and is_class(module, "torchvision.", "BasicBlock", "Bottleneck"):
            forward = torchvision.resnet_block(module)
        elif conv_bn_folding and is_class(module, "torchvision.", "ResNet"):
            forward = torchvision.resnet(module)
        elif is_class(module, "torchvision.", "SqueezeExcitation"):
            forward = torchvision.squeeze_excitation(module)
        elif conv_bn_folding and is_class(module, transformers.RESNET, *transformers.RESNET_LAYERS):
            forward = transformers.resnet_layer(module)
        else:
            forward = transformers.block(module)
        if forward is not None:
            module.__dict__["forward"] = forward
            done.append(type(module).__name__)
    return done[::-1]  # in the model's order
