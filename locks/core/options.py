"""A method's options, declared: one frozen dataclass per method whose fields are its config keys.

Each field is `option(default, check)`. The default is what `conf/method/<name>.yaml` sets; `check(key, value)`
returns the value (normalized: a tolerance given as an integer becomes a float) or raises one ConfigError line that
says what the key must be. Rules between options go in `check()`, rules between the options and the budget in
`check_budget(budget)`; a rule that needs the model's shape (head_dim) stays with the selector.

A selector names its dataclass in `Selector.Options`. Its constructor builds it from the config's keyword arguments,
and each option becomes an attribute of the selector, under its own name or the `attr` its field names.
`eval/config_schema.py` reads the same fields for the config's keys and types (docs/adding_a_method.md).
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field, fields
from typing import Any, Callable, ClassVar

from locks.errors import ConfigError

Check = Callable[[str, Any], Any]  # (config key, value) -> the value, or ConfigError


def option(default, check: Check | None = None, attr: str | None = None):
    """A config key with its default, its check, and the selector attribute it sets (default: its own name)."""
    return field(default=default, metadata={"check": check, "attr": attr})


def _is_int(value) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def integer(minimum: int | None = None) -> Check:
    """An integer, at least `minimum` when given."""
    def check(key, value):
        if not _is_int(value) or (minimum is not None and value < minimum):
            what = ("an integer" if minimum is None else "a positive integer" if minimum == 1
                    else f"an integer >= {minimum}")
            raise ConfigError(f"{key} must be {what} (got {value!r})")
        return value
    return check


positive_int = integer(1)


def odd_positive_int(key, value):
    if not _is_int(value) or value < 1 or value % 2 == 0:
        raise ConfigError(f"{key} must be an odd positive integer (got {value!r})")
    return value


def power_of_two(key, value):
    if not _is_int(value) or value < 1 or value & (value - 1):
        raise ConfigError(f"{key} must be a power of two (got {value!r})")
    return value


def one_of(*choices) -> Check:
    def check(key, value):
        if isinstance(value, bool) or value not in choices:
            raise ConfigError(f"{key} must be one of {choices} (got {value!r})")
        return value
    return check


def flag(key, value):
    if not isinstance(value, bool):
        raise ConfigError(f"{key} must be true or false (got {value!r})")
    return value


def number(minimum: float | None = None, maximum: float | None = None, allow_none: bool = False) -> Check:
    """A finite number in [minimum, maximum] (either bound optional), as a float; None too when `allow_none`."""
    def check(key, value):
        if value is None and allow_none:
            return None
        ok = isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)
        if not ok or (minimum is not None and value < minimum) or (maximum is not None and value > maximum):
            bounds = (f"in [{minimum}, {maximum}]" if minimum is not None and maximum is not None
                      else f">= {minimum}" if minimum is not None else f"<= {maximum}" if maximum is not None else "")
            what = f"a finite number {bounds}".strip()
            raise ConfigError(f"{key} must be {'null or ' if allow_none else ''}{what} (got {value!r})")
        return float(value)
    return check


def path_or(literal: str, what: str) -> Check:
    """`literal` (e.g. 'auto') or the path of `what`: any non-empty string (the method checks the file itself)."""
    def check(key, value):
        if not isinstance(value, str) or not value:
            raise ConfigError(f"{key} must be {literal!r} or the path of {what} (got {value!r})")
        return value
    return check


def or_literal(check: Check, *literals) -> Check:
    """`check`, or one of these literal values (e.g. 'auto')."""
    def either(key, value):
        if isinstance(value, str) and value in literals:
            return value
        try:
            return check(key, value)
        except ConfigError as error:  # "<key> must be X (got v)" -> "<key> must be X or 'auto' (got v)"
            alternatives = "".join(f" or {literal!r}" for literal in literals)
            raise ConfigError(str(error).replace(" (got ", f"{alternatives} (got ", 1)) from None
    return either


@dataclass(frozen=True)
class Options:
    """The options every method has."""

    budget_mode: str = option("fair", one_of("fair", "paper"))  # docs/budgets.md

    def __post_init__(self):
        for f in fields(self):
            check = f.metadata.get("check")
            if check is not None:
                object.__setattr__(self, f.name, check(f"method.{f.name}", getattr(self, f.name)))
        self.check()

    def check(self) -> None:
        """Rules between options: raise one ConfigError line. Default: none."""

    # the option whose value is the smallest budget a selector can spend (its unit of selection, e.g. one page);
    # None: any positive budget
    budget_unit: ClassVar[str | None] = None

    def check_budget(self, budget: int) -> None:
        """Rules between the options and the budget: raise one ConfigError line. Default: budget >= `budget_unit`."""
        if self.budget_unit is not None and budget < (unit := getattr(self, self.budget_unit)):
            raise ConfigError(f"budget must be >= method.{self.budget_unit}={unit} tokens, the unit this method "
                              f"selects (got {budget})")

    def dense_layer(self, layer_idx: int, num_layers: int) -> bool:
        """Whether the core attends this layer densely instead of building the method's selector
        (locks/core/dense.py). Default: the first `dense_layers` layers, for a method that has that option."""
        return layer_idx < getattr(self, "dense_layers", 0)

    @classmethod
    def build(cls, options: dict) -> "Options":
        known = [f.name for f in fields(cls)]
        unknown = sorted(set(options) - set(known))
        if unknown:
            raise ConfigError(f"method.{unknown[0]}: unknown option (known: {', '.join(sorted(known))})")
        return cls(**options)

    @classmethod
    def defaults(cls) -> dict[str, Any]:
        """Each config key and its default, in declaration order."""
        return {f.name: f.default for f in fields(cls)}

    def attributes(self) -> dict[str, Any]:
        """The selector attributes these options set: attribute name -> value."""
        return {f.metadata.get("attr") or f.name: getattr(self, f.name) for f in fields(self)}
