"""The model a config describes, built on the meta device and held against a weight file's tensors; and the config
field a difference points at.

A folder's config and weights agree when the model the config builds holds the file's tensors, each of the file's
shape. That model is built as from_pretrained builds it before loading: with the class the config names
(`architectures`), on the meta device (shapes without memory, so a tampered size of 10^9 costs nothing) and without
running the weight init. A tensor tied to another (the MLM decoder to the word embeddings, ELECTRA's generator
embeddings to the discriminator's) may be absent, and the patterns the class gives from_pretrained
(`_keys_to_ignore_on_load_missing` / `_unexpected`) and the buffers it no longer saves (an older checkpoint's
`position_ids`) are let through, as from_pretrained lets them.

Nothing here names a config field or a weight: the field a difference points at is the one that, changed alone, makes
the model hold the file's tensors (`field_behind`), found by building the model again for each field of the config's
class.
"""

from __future__ import annotations

import copy
import re
from collections import defaultdict
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field, fields
from fractions import Fraction
from itertools import combinations


@dataclass
class Differences:
    """How a model's tensors differ from a file's."""

    missing: list[str] = field(default_factory=list)  # the model's, not in the file (in the model's order)
    extra: list[str] = field(default_factory=list)  # the file's, with no place in the model (in the file's order)
    misshapen: list[tuple[str, list[int], list[int]]] = field(default_factory=list)  # (name, the file's, the model's)

    def __bool__(self) -> bool:
        return bool(self.missing or self.extra or self.misshapen)


@dataclass
class Comparison:
    """A config's model held against a file: the layers each has (when they differ), else their differences."""

    config: object
    model: object  # built on the meta device
    shapes: dict[str, list[int]]  # the file's tensors that the model is held against
    layer_stack: str | None  # the name of the module list of the base model's layers, as the file names it
    file_layers: int | None  # how many layers the file holds, where the config asks for another count
    differences: Differences

    def short(self, name: str, numbered: bool = False) -> str:
        """A tensor's name inside the base model (without its prefix), its layer's number as N when `numbered`."""
        if numbered and self.layer_stack and name.startswith(f"{self.layer_stack}."):
            name = re.sub(r"^\d+\.", "N.", name.removeprefix(f"{self.layer_stack}."), count=1)
            name = f"{self.layer_stack}.{name}"
        prefix = f"{self.model.base_model_prefix}."
        return name.removeprefix(prefix) if self.model.base_model is not self.model else name


@contextmanager
def on_meta() -> Iterator[None]:
    """Modules built inside hold meta tensors (shapes without memory) and skip their weight init, as the empty model
    from_pretrained loads into. What their constructors warn of concerns running them, which these never do: it is
    not shown (a check that builds a dozen would print it a dozen times)."""
    import logging
    import warnings
    from contextlib import nullcontext

    import torch
    from transformers import initialization

    # (as from_pretrained: a creation op a constructor reads a number from, such as linspace, runs on the CPU)
    safe_creation_ops = getattr(initialization, "meta_device_safe_creation_ops", nullcontext)
    logger = logging.getLogger("transformers")
    level = logger.level
    logger.setLevel(logging.ERROR)
    try:
        with torch.device("meta"), initialization.no_init_weights(), safe_creation_ops(), warnings.catch_warnings():
            warnings.simplefilter("ignore")
            yield
    finally:
        logger.setLevel(level)


def model_class(config):
    """The class `config.architectures` names, from convattn's public names or transformers', when it builds from
    this config; None otherwise (the base model, AutoModel's, is built)."""
    import transformers
    from transformers import PreTrainedModel

    import convattn

    for name in (config.architectures or [])[:1]:
        for package in (convattn, transformers):
            found = getattr(package, name, None)
            config_class = getattr(found, "config_class", None)
            if isinstance(found, type) and issubclass(found, PreTrainedModel) and isinstance(config_class, type) \
                    and isinstance(config, config_class):
                return found
    return None


def build(cls, config):
    """`cls(config)` on the meta device (AutoModel's class for the config when `cls` is None)."""
    from transformers import AutoModel

    with on_meta():
        return AutoModel.from_config(config) if cls is None else cls(config)


def held_by(model, shapes: dict[str, list[int]]) -> dict[str, list[int]]:
    """The file's tensors a model loads: all of them, or for a bare base model given a file with a head, those under
    the base model's prefix, without it (as from_pretrained loads an encoder out of a headed checkpoint)."""
    prefix = f"{model.base_model_prefix}."
    if model.base_model is model and any(name.startswith(prefix) for name in shapes):
        return {name.removeprefix(prefix): shape for name, shape in shapes.items() if name.startswith(prefix)}
    return shapes


def differences(model, shapes: dict[str, list[int]]) -> Differences:
    """The model's saved tensors (its state dict) against the file's, taken as from_pretrained takes them."""
    state = model.state_dict(keep_vars=True)
    tied = getattr(model, "all_tied_weights_keys", None) or {}
    shared = defaultdict(list)  # one tensor under several names (a module used twice): one of them saved
    for name, tensor in state.items():
        shared[id(tensor)].append(name)
    may_lack = pattern(getattr(model, "_keys_to_ignore_on_load_missing", None))
    may_hold = pattern(getattr(model, "_keys_to_ignore_on_load_unexpected", None))
    unsaved_buffers = {name for name, _ in model.named_buffers()} - set(state)
    return Differences(
        missing=[name for name, tensor in state.items() if name not in shapes and name not in tied
                 and not any(alias in shapes for alias in shared[id(tensor)]) and not may_lack(name)],
        extra=[name for name in shapes if name not in state and name not in unsaved_buffers and not may_hold(name)],
        misshapen=[(name, list(shapes[name]), list(tensor.shape)) for name, tensor in state.items()
                   if name in shapes and list(shapes[name]) != list(tensor.shape)],
    )


def pattern(patterns) -> Callable[[str], bool]:
    """Whether a name matches any of a class's regular expressions (re.search, as from_pretrained matches them)."""
    compiled = [re.compile(p) for p in patterns or ()]
    return lambda name: any(p.search(name) for p in compiled)


def layer_stack(model, layers: int) -> str | None:
    """The name (as the file names it) of the base model's module list of `layers` blocks (`encoder.layer`)."""
    import torch

    base = model.base_model
    prefix = "" if base is model else f"{model.base_model_prefix}."
    return next((prefix + name for name, module in base.named_modules()
                 if isinstance(module, torch.nn.ModuleList) and len(module) == layers), None)


def compare(config, shapes: dict[str, list[int]]) -> Comparison:
    """The model `config` describes against a file's tensors `shapes` (read from its headers). A config with more
    layers than the file has tensors cannot describe it (each layer holds one at least): its model is built with
    one layer more than that, which shows as much and bounds the work by the file, not by the config."""
    cls = model_class(config)
    layers = getattr(config, "num_hidden_layers", None)
    built = config
    if isinstance(layers, int) and layers > len(shapes) + 1:
        built = changed(config, "num_hidden_layers", len(shapes) + 1)
    model = build(cls, built)
    held = held_by(model, shapes)
    stack = layer_stack(model, built.num_hidden_layers) if isinstance(layers, int) else None
    if stack:
        numbers = {name.removeprefix(f"{stack}.").split(".", 1)[0] for name in held if name.startswith(f"{stack}.")}
        # another count of layers; the same count numbered otherwise (a layer renamed) is a tensor missing and one
        # left over, which the differences name
        if numbers and len(numbers) != layers:
            return Comparison(config, model, held, stack, len(numbers), Differences())
    return Comparison(config, model, held, stack, None, differences(model, held))


def changed(config, name: str, value):
    """A copy of `config` with one field changed (not validated: a value the class would refuse may still build)."""
    other = copy.deepcopy(config)
    setattr(other, name, value)
    return other


def own_fields(config) -> list[str]:
    """The fields the config's class declares beyond transformers' base config's, in declaration order."""
    from transformers import PretrainedConfig

    base = {f.name for f in fields(PretrainedConfig)}
    return [f.name for f in fields(type(config)) if f.name not in base]


def field_behind(comparison: Comparison) -> str | None:
    """The field whose value, changed alone, makes the model hold the file's tensors: the one the weights contradict
    (None when no one field does). Each field of the config's class is tried with the values that could explain the
    differences (every other choice, subset or truth value; for a number, values about it for a tensor missing or
    left over, then the one the first size differing points at), fields of those kinds first for a tensor missing or
    left over, numbers first for a shape."""
    config, found = comparison.config, comparison.differences
    cls = type(comparison.model) if model_class(config) is not None else None
    names = own_fields(config)
    numbers = [name for name in names if is_number(getattr(config, name))]
    others = [name for name in names if name not in numbers]
    order = numbers + others if found.misshapen and not (found.missing or found.extra) else others + numbers
    for name in order:
        for value in values_to_try(comparison, name, cls):
            try:
                model = build(cls, changed(config, name, value))
            except Exception:  # a value the modules cannot take (this one was not validated): not the one
                continue
            if not differences(model, held_by(model, comparison.shapes)):
                return name
    return None


def field_too_large(config) -> str | None:
    """For a config whose model cannot be built (a size past what even a meta tensor counts: its bytes over 2^63):
    the number field whose value, set back to its default, lets it build."""
    cls = model_class(config)
    defaults = {f.name: f.default for f in fields(type(config))}
    for name in own_fields(config):
        value, default = getattr(config, name), defaults.get(name)
        if is_number(value) and is_number(default) and value != default:
            try:
                build(cls, changed(config, name, default))
            except Exception:  # (still not buildable: not this field alone)
                continue
            return name
    return None


def is_number(value) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool)


def values_to_try(comparison: Comparison, name: str, cls) -> Iterator:
    """The values of field `name` that could explain the comparison's differences."""
    config = comparison.config
    value = getattr(config, name)
    choices = getattr(type(config), "field_choices", {}).get(name)
    subsets = getattr(type(config), "field_subsets", {}).get(name)
    if isinstance(value, bool):
        yield not value
    elif choices and isinstance(value, str):
        yield from (choice for choice in choices if choice != value)
    elif subsets is not None:
        every = [list(chosen) for size in range(len(subsets) + 1) for chosen in combinations(subsets, size)]
        yield from (chosen for chosen in every if chosen != list(value))
    elif is_number(value):
        yield from number_values(comparison, name, value, cls)


def number_values(comparison: Comparison, name: str, value, cls) -> Iterator:
    """For a shape: the value that the size differing points at, assuming the size is affine in the field (found by
    building once more with another value); for a tensor missing or left over, values about this one."""
    kind = int if isinstance(value, int) else float
    found = comparison.differences
    if found.missing or found.extra:
        tried = [value * 2, value // 2, value + 1, value - 1] if kind is int else [value / 2, value * 2]
        yield from (v for v in dict.fromkeys(tried) if v != value and v >= 0)
    if not found.misshapen:
        return
    tensor, in_file, in_model = found.misshapen[0]
    if len(in_file) != len(in_model):
        return  # (a tensor of another kind: a field of choices builds it)
    axis = next(i for i, (a, b) in enumerate(zip(in_file, in_model, strict=True)) if a != b)
    # halved first: a tampered size doubled may overflow even a meta tensor's byte count (2^63)
    probes = [value // 2, value * 2, value + 1, value * 2 + 1] if kind is int else [value / 2, value * 2]
    for probe in (p for p in probes if p != value):
        try:
            probed = build(cls, changed(comparison.config, name, probe)).state_dict()[tensor].shape[axis]
            break
        except Exception:  # (KeyError: the tensor goes with another value; a value the modules cannot take)
            continue
    else:
        return
    if probed == in_model[axis]:
        return  # this field does not size that axis
    slope = Fraction(probed - in_model[axis]) / (Fraction(probe) - Fraction(value))
    wanted = Fraction(value) + (in_file[axis] - in_model[axis]) / slope
    if kind is float:
        yield float(wanted)
    elif round(wanted) >= 0:
        yield round(wanted)
