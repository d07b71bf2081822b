"""The method registry: selectors register themselves by name; the core finds them by scanning method packages.

A method is a package or module under one of METHOD_PACKAGES whose Selector subclass is decorated with `@register`
(docs/adding_a_method.md). The core never imports a method by name: `discover()` imports those packages once,
which runs the decorators.
"""
from __future__ import annotations

import dataclasses
import importlib
from dataclasses import dataclass, field

from locks.core.dense import DenseAttention
from locks.core.selector import LayerInfo, Selector
from locks.errors import ConfigError

METHOD_PACKAGES = ("locks.method", "baselines")  # scanned for @register-ed selectors

SELECTORS: dict[str, type[Selector]] = {}
_DISCOVERED = [False]


def register(cls: type[Selector]) -> type[Selector]:
    """Class decorator: make `cls` buildable by its `name` (a second class with the same name is an error)."""
    other = SELECTORS.get(cls.name)
    if other is not None and other is not cls and other.__qualname__ != cls.__qualname__:
        raise ValueError(f"two selectors are registered as {cls.name!r}: {other.__module__} and {cls.__module__}")
    SELECTORS[cls.name] = cls
    return cls


def discover() -> dict[str, type[Selector]]:
    """Import the METHOD_PACKAGES (once) and return the registry: name -> Selector class. Each package's __init__
    imports its selectors (baselines/: every module or sub-package in it; locks/method/: the LOCKS selector), never
    its Triton kernels, which need the optional triton package and are imported when a selector runs them."""
    if not _DISCOVERED[0]:
        for package_name in METHOD_PACKAGES:
            importlib.import_module(package_name)
        _DISCOVERED[0] = True
    return SELECTORS


def selector_class(name: str) -> type[Selector]:
    methods = discover()
    if name not in methods:
        raise ConfigError(f"unknown method {name!r}; choose one of {sorted(methods)}")
    return methods[name]


def display_name(name: str) -> str:
    """The table / figure name of a registered method (its `display_name`, else its registry name)."""
    cls = discover().get(name)
    return (cls.display_name or cls.name) if cls is not None else name


def plot_style(name: str) -> dict:
    """Matplotlib keyword arguments of a registered method's line (its `plot_style`; {} when unknown)."""
    cls = discover().get(name)
    return dict(cls.plot_style) if cls is not None else {}


def bounds(name: str) -> str:
    """What a registered upper-bound reference bounds (its `bounds`); "" for an implementable method."""
    cls = discover().get(name)
    return cls.bounds if cls is not None else ""


def report_order(name: str) -> int:
    """Rank of a method in tables and legends (its `report_order`; unknown methods last)."""
    cls = discover().get(name)
    return cls.report_order if cls is not None else 10**6


@dataclass
class MethodSpec:
    """A method as configured: its registry name and keyword arguments (from `conf/method/<name>.yaml`)."""

    name: str
    budget: int
    options: dict = field(default_factory=dict)
    backend: str = "auto"  # method.backend: auto (triton on CUDA when importable, else torch) | triton | torch

    def selector_class(self) -> type[Selector]:
        return selector_class(self.name)

    def for_model(self, model) -> "MethodSpec":
        """This spec with its options resolved for `model` (its selector class's `prepare_options`); itself when
        nothing changes."""
        options = self.selector_class().prepare_options(model, dict(self.options))
        return self if options == self.options else dataclasses.replace(self, options=options)

    def check_model_config(self, model_config) -> None:
        """Before the model loads: the selector class's `check_model_config` of these options."""
        cls = self.selector_class()
        cls.check_model_config(cls.Options.build(self.options), model_config)

    def build(self, info: LayerInfo) -> Selector:
        """The method's selector of this layer; on a layer its options keep dense (`Options.dense_layer`: the first
        `dense_layers` layers by default), the core's dense layer (locks/core/dense.py)."""
        cls = self.selector_class()
        if cls.Options.build(self.options).dense_layer(info.layer_idx, info.num_layers):
            return DenseAttention(info, budget=self.budget)
        return cls(info, budget=self.budget, **self.options)
