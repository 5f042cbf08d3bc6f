"""The model: a multilayer perceptron with one output (a classifier's logit, a regressor's standardized
value), with feature standardization built in, and its served forms."""

from __future__ import annotations

import itertools

import torch
from torch import nn


class Standardize(nn.Module):
    """(x - mean) / std with the training set's statistics kept as buffers, so the exported model takes raw
    features."""

    def __init__(self, mean: torch.Tensor, std: torch.Tensor) -> None:
        super().__init__()
        self.register_buffer("mean", mean.clone().float())
        self.register_buffer("std", std.clone().float())

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return (x - self.mean) / self.std


class Block(nn.Module):
    """Linear -> ReLU -> Dropout: the unit FSDP shards."""

    def __init__(self, d_in: int, d_out: int, dropout: float) -> None:
        super().__init__()
        self.linear = nn.Linear(d_in, d_out)
        self.act = nn.ReLU()
        self.dropout = nn.Dropout(dropout)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.dropout(self.act(self.linear(x)))


class MLPClassifier(nn.Module):
    """Returns one logit per row; the probability of the positive class is sigmoid(logit)."""

    def __init__(
        self,
        n_features: int,
        hidden: tuple[int, ...],
        dropout: float = 0.0,
        mean: torch.Tensor | None = None,
        std: torch.Tensor | None = None,
    ) -> None:
        super().__init__()
        self.standardize = Standardize(
            mean if mean is not None else torch.zeros(n_features),
            std if std is not None else torch.ones(n_features),
        )
        widths = (n_features, *hidden)
        self.blocks = nn.ModuleList(Block(a, b, dropout) for a, b in itertools.pairwise(widths))
        self.head = nn.Linear(widths[-1], 1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.standardize(x)
        for block in self.blocks:
            h = block(h)
        return self.head(h).squeeze(-1)


def count_parameters(model: nn.Module) -> int:
    return sum(p.numel() for p in model.parameters())


class Rescaled(nn.Module):
    """The served form of a regressor trained on standardized targets: its output in the target's units."""

    def __init__(self, regressor: nn.Module, mean: float, std: float) -> None:
        super().__init__()
        self.regressor = regressor
        self.register_buffer("mean", torch.tensor(mean, dtype=torch.float32))
        self.register_buffer("std", torch.tensor(std, dtype=torch.float32))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.regressor(x) * self.std + self.mean


class Probability(nn.Module):
    """The served form of a classifier: sigmoid(logit), the probability that the flight is late."""

    def __init__(self, classifier: nn.Module) -> None:
        super().__init__()
        self.classifier = classifier

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.sigmoid(self.classifier(x))
