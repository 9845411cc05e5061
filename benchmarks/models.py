"""The models the end-to-end benchmarks run: ResNet-50 and a BERT-base-shaped encoder, built from torch.nn alone.

torchvision does not import beside every torch ember is measured with (PyPI's torchvision and the CPU torch of
the development machine), so ResNet-50 is spelled out here, layer for layer as torchvision's ``resnet50()``
(v1.5: the stride sits on the 3x3 convolution; 25,557,032 parameters). The encoder has BERT-base's shape: 30522 x
768 token embeddings, 12 post-norm layers of 12 heads with a 3072-wide GELU feed-forward, a pooler and a
classification head, i.e. the fine-tuning setting in which CPUs train BERT.
"""

from __future__ import annotations

import torch
from torch import nn


class Bottleneck(nn.Module):
    expansion = 4

    def __init__(self, in_channels: int, width: int, stride: int) -> None:
        super().__init__()
        out_channels = width * self.expansion
        self.conv1 = nn.Conv2d(in_channels, width, 1, bias=False)
        self.bn1 = nn.BatchNorm2d(width)
        self.conv2 = nn.Conv2d(width, width, 3, stride=stride, padding=1, bias=False)
        self.bn2 = nn.BatchNorm2d(width)
        self.conv3 = nn.Conv2d(width, out_channels, 1, bias=False)
        self.bn3 = nn.BatchNorm2d(out_channels)
        self.relu = nn.ReLU(inplace=True)
        self.downsample: nn.Module | None = None
        if stride != 1 or in_channels != out_channels:
            self.downsample = nn.Sequential(
                nn.Conv2d(in_channels, out_channels, 1, stride=stride, bias=False), nn.BatchNorm2d(out_channels)
            )

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        identity = x if self.downsample is None else self.downsample(x)
        out = self.relu(self.bn1(self.conv1(x)))
        out = self.relu(self.bn2(self.conv2(out)))
        return self.relu(self.bn3(self.conv3(out)) + identity)


class ResNet50(nn.Module):
    def __init__(self, classes: int = 1000) -> None:
        super().__init__()
        self.conv1 = nn.Conv2d(3, 64, 7, stride=2, padding=3, bias=False)
        self.bn1 = nn.BatchNorm2d(64)
        self.relu = nn.ReLU(inplace=True)
        self.maxpool = nn.MaxPool2d(3, stride=2, padding=1)
        stages, in_channels = [], 64
        for width, blocks, stride in ((64, 3, 1), (128, 4, 2), (256, 6, 2), (512, 3, 2)):
            layers = []
            for block in range(blocks):
                layers.append(Bottleneck(in_channels, width, stride if block == 0 else 1))
                in_channels = width * Bottleneck.expansion
            stages.append(nn.Sequential(*layers))
        self.layer1, self.layer2, self.layer3, self.layer4 = stages
        self.avgpool = nn.AdaptiveAvgPool2d(1)
        self.fc = nn.Linear(in_channels, classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.maxpool(self.relu(self.bn1(self.conv1(x))))
        x = self.layer4(self.layer3(self.layer2(self.layer1(x))))
        return self.fc(torch.flatten(self.avgpool(x), 1))


class BertShapedEncoder(nn.Module):
    def __init__(
        self,
        vocab: int = 30522,
        hidden: int = 768,
        layers: int = 12,
        heads: int = 12,
        ffn: int = 3072,
        max_positions: int = 512,
        classes: int = 2,
    ) -> None:
        super().__init__()
        self.tokens = nn.Embedding(vocab, hidden)
        self.positions = nn.Embedding(max_positions, hidden)
        self.segments = nn.Embedding(2, hidden)
        self.norm = nn.LayerNorm(hidden, eps=1e-12)
        self.dropout = nn.Dropout(0.1)
        layer = nn.TransformerEncoderLayer(
            hidden, heads, ffn, dropout=0.1, activation="gelu", layer_norm_eps=1e-12, batch_first=True
        )
        self.encoder = nn.TransformerEncoder(layer, layers, enable_nested_tensor=False)
        self.pooler = nn.Linear(hidden, hidden)
        self.classifier = nn.Linear(hidden, classes)

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        positions = torch.arange(tokens.shape[1], device=tokens.device)
        segments = torch.zeros_like(tokens)
        x = self.tokens(tokens) + self.positions(positions) + self.segments(segments)
        x = self.encoder(self.dropout(self.norm(x)))
        return self.classifier(torch.tanh(self.pooler(x[:, 0])))
