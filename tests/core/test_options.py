"""A method's options are one frozen dataclass (locks/core/options.py): the checks, the schema read from it, and the
selector attributes it sets."""
import dataclasses

import pytest

from eval.config_schema import method_schema
from locks.core.options import (Options, flag, integer, number, odd_positive_int, one_of, or_literal, positive_int,
                                power_of_two)
from locks.core.registry import discover, selector_class
from locks.core.selector import LayerInfo
from locks.errors import ConfigError

INFO = LayerInfo(layer_idx=3, num_heads=4, num_kv_heads=2, head_dim=16, scaling=0.25)


@pytest.mark.parametrize("check,good,bad,message", [
    (integer(0), [0, 5], [-1, 1.0, True, "3"], "must be an integer >= 0"),
    (positive_int, [1, 7], [0, 2.5, False], "must be a positive integer"),
    (integer(), [-3, 0], [1.5, None], "must be an integer (got"),
    (odd_positive_int, [1, 63], [0, 64, -1, True], "must be an odd positive integer"),
    (power_of_two, [1, 16], [0, 12, -16, True], "must be a power of two"),
    (one_of("a", "b"), ["a"], ["c", None], "must be one of ('a', 'b')"),
    (one_of(8, 4), [8], [True, 2], "must be one of (8, 4)"),
    (flag, [True, False], [1, "true"], "must be true or false"),
    (number(0), [0, 0.5, 3], [-0.1, float("inf"), float("nan"), True, "1"], "must be a finite number >= 0"),
    (number(0, 1, allow_none=True), [None, 0, 1], [1.5, -1], "must be null or a finite number in [0, 1]"),
    (or_literal(integer(0), "auto"), ["auto", 0, 48], ["other", -1], "must be an integer >= 0 or 'auto' (got"),
])
def test_each_check_accepts_what_it_names_and_refuses_the_rest_in_one_line(check, good, bad, message):
    for value in good:
        assert check("method.x", value) == value
    for value in bad:
        with pytest.raises(ConfigError) as err:
            check("method.x", value)
        text = str(err.value)
        assert text.startswith("method.x ") and message in text and f"(got {value!r})" in text and "\n" not in text


def test_a_number_is_a_float_and_the_options_are_frozen():
    @dataclasses.dataclass(frozen=True)
    class Tolerant(Options):
        tol: float = dataclasses.field(default=1e-2, metadata={"check": number(0)})

    opts = Tolerant.build({"tol": 0})
    assert opts.tol == 0.0 and isinstance(opts.tol, float)
    with pytest.raises(dataclasses.FrozenInstanceError):
        opts.tol = 1.0


@pytest.mark.parametrize("name", sorted(discover()))
def test_every_method_builds_from_its_options_and_refuses_an_unknown_one(name):
    """The schema is the Options' fields; each option becomes an attribute (its own name or the field's attr); an
    unknown key is one line naming it and the known ones."""
    cls = selector_class(name)
    schema, source = method_schema(name)
    assert {k: v for k, v in schema.items() if k not in ("name", "budget", "backend")} == cls.Options.defaults()
    assert cls.Options.__name__ in source
    selector = cls(INFO, 256)
    assert selector.options == cls.Options()
    for field in dataclasses.fields(cls.Options):
        attribute = field.metadata.get("attr") or field.name
        assert getattr(selector, attribute) == field.default, (name, field.name)
    with pytest.raises(ConfigError, match=r"^method.pagesize: unknown option \(known: .*budget_mode"):
        cls(INFO, 256, pagesize=16)


@pytest.mark.parametrize("name,options,message", [
    ("quest", {"page_size": 32}, "budget must be >= method.page_size=32 tokens, the unit this method selects (got 16)"),
    ("locks", {"page_size": 32, "rank": 8}, "budget must be >= method.page_size=32 tokens, the unit this method selects"),
    ("rocketkv", {"budget_mode": "paper"}, None),
    ("shadowkv", {"budget_mode": "paper", "chunk_size": 12}, "a multiple of method.chunk_size=12"),
])
def test_rules_between_the_options_and_the_budget(name, options, message):
    cls = selector_class(name)
    if message is None:  # within its rule: builds
        cls(INFO, 16, **options)
        with pytest.raises(ConfigError, match="budget must be >= 2 in budget_mode=paper"):
            cls(INFO, 1, **options)
        return
    with pytest.raises(ConfigError, match=message.replace("(", r"\(").replace(")", r"\)")):
        cls(INFO, 16, **options)


@pytest.mark.parametrize("options,message", [
    ({"rank": 16}, "method.rank must satisfy 0 <= rank < method.page_size=16 (got 16)"),
    ({"quant": "none", "v_bits": 2}, "need method.quant=int"),
    ({"v_bits": 3}, "method.v_bits must be one of (8, 4, 2) (got 3)"),
    ({"log_z": "previous", "aggregation": "raw"}, "method.log_z=previous applies to aggregation norm or max"),
])
def test_rules_between_options_hold_before_any_model(options, message):
    """LOCKS's rules between its options are the Options' own: they need no layer."""
    with pytest.raises(ConfigError) as err:
        selector_class("locks").Options.build(options)
    assert message in str(err.value)
