"""Layer-wise learning-rate decay (ELECTRA, ConvBERT): one AdamW parameter group per depth."""

from __future__ import annotations

import re

from torch import nn
from transformers import Trainer

from convattn.training.guards import FiniteTraining
from convattn.training.schedule import ScheduledTrainer

LAYER_INDEX = re.compile(r"(?:^|\.)layer\.(\d+)\.")
EMBEDDINGS = re.compile(r"(?:^|\.)embeddings(?:_project)?\.")
SHARED_ENCODER = re.compile(r"(?:^|\.)encoder\.shared\.")  # convattn modules used by every layer


def layer_depths(names: list[str]) -> tuple[dict[str, int], int]:
    """ELECTRA's depths (also ConvBERT's): embeddings 0, encoder layer i -> i + 1, the rest (head, pooler)
    n_layers + 2. Works on convattn and BERT-like names (`*.embeddings.*`, `*.layer.{i}.*`)."""
    n_layers = 1 + max((int(m.group(1)) for n in names if (m := LAYER_INDEX.search(n))), default=-1)

    def depth(name: str) -> int:
        if EMBEDDINGS.search(name):
            return 0
        if m := LAYER_INDEX.search(name):
            return int(m.group(1)) + 1
        return 1 if SHARED_ENCODER.search(name) else n_layers + 2

    return {name: depth(name) for name in names}, n_layers


def layerwise_param_groups(model: nn.Module, learning_rate: float, weight_decay: float, layer_decay: float,
                           decay_names: set[str]) -> list[dict]:
    """AdamW groups with lr * layer_decay ** (n_layers + 2 - depth); no weight decay where not in decay_names."""
    params = [(n, p) for n, p in model.named_parameters() if p.requires_grad]
    depths, n_layers = layer_depths([n for n, _ in params])
    groups: dict[tuple[int, bool], dict] = {}
    for name, param in params:
        decays = name in decay_names
        group = groups.setdefault((depths[name], decays), {
            "params": [],
            "weight_decay": weight_decay if decays else 0.0,
            "lr": learning_rate * layer_decay ** (n_layers + 2 - depths[name]),
        })
        group["params"].append(param)
    return list(groups.values())


class LayerDecayTrainer(ScheduledTrainer, FiniteTraining, Trainer):
    """Trainer whose AdamW has one parameter group per depth (layer-wise lr decay); linear warmup/decay as usual.
    It stops at the first non-finite loss and never saves non-finite weights (`FiniteTraining`)."""

    def __init__(self, *args, layer_decay: float = 1.0, **kwargs):
        super().__init__(*args, **kwargs)
        self.layer_decay = layer_decay
        self.divergence_hint = f"lower --lr (now {self.args.learning_rate:g})"

    def create_optimizer(self, model=None):
        if self.optimizer is None:
            model = self.model if model is None else model
            groups = layerwise_param_groups(model, self.args.learning_rate, self.args.weight_decay, self.layer_decay,
                                            set(self.get_decay_parameter_names(model)))
            optimizer_cls, optimizer_kwargs = self.get_optimizer_cls_and_kwargs(self.args, model)
            self.optimizer = optimizer_cls(groups, **optimizer_kwargs)
        return self.optimizer
