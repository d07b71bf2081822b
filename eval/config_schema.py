"""The config's schema, checked before any work (run.py): every key of the composed config must exist in its
schema and have the schema's type, else one ConfigError line names the key, what was given and what is expected.

The schema is the project's own configuration, not a second copy of it: the top-level keys and their types are
those of conf/config.yaml, a config group's are those of the group file the run chose (conf/<group>/<choice>.yaml,
plus what a chosen +experiment preset adds), and a method's options are the fields of its selector's `Options`
dataclass, typed by their defaults (docs/architecture.md). A None default or an interpolation accepts any value.
"""
from __future__ import annotations

import copy
import functools
from pathlib import Path

from omegaconf import DictConfig, ListConfig, OmegaConf

from locks.errors import ConfigError

CONF = Path(__file__).resolve().parents[1] / "conf"
GROUPS = ("benchmark", "model", "logger")
METHOD_KEYS = {"name": "", "budget": 1, "backend": "auto"}  # keys every method has besides its constructor's
RUN_KEYS = {"job": "benchmark", "profile": None,  # set by presets (conf/experiment/), typed there
            "plan": False}  # +plan=true: print the run's memory plan (eval/memory_plan.py) and run nothing
# keys whose value is one of several kinds: auto | true | false
ALTERNATIVES = {"static_decode": ("auto", True), "benchmark.chat_template": ("auto", True)}


def _kind(value) -> str:
    if isinstance(value, bool):
        return "a boolean (true/false)"
    if isinstance(value, int):
        return "an integer"
    if isinstance(value, float):
        return "a number"
    if isinstance(value, str):
        return "a string"
    if isinstance(value, (list, tuple, ListConfig)):
        return "a list"
    if isinstance(value, (dict, DictConfig)):
        return "a mapping"
    return type(value).__name__


def _fits(value, ref) -> bool:
    """Whether `value` has the type of the schema value `ref` (lists: the kind only; a scalar where the default is a
    list is accepted too, e.g. context_length=4096 for [4096, 8192], and a list where the default is a scalar)."""
    if ref is None or value is None:
        return True
    if isinstance(ref, bool):
        return isinstance(value, bool)
    if isinstance(ref, int):
        return isinstance(value, int) and not isinstance(value, bool) or _list_of(value, ref)
    if isinstance(ref, float):
        return isinstance(value, (int, float)) and not isinstance(value, bool)
    if isinstance(ref, str):
        return isinstance(value, str) or _list_of(value, ref)
    if isinstance(ref, (list, ListConfig)):
        return isinstance(value, (list, ListConfig)) or (len(ref) > 0 and _fits(value, ref[0]))
    return True


def _list_of(value, ref) -> bool:
    return isinstance(value, (list, ListConfig)) and all(_fits(v, ref) for v in value)


def _check(where: str, values: dict, schema: dict, source: str) -> None:
    for key, value in values.items():
        name = f"{where}.{key}" if where else key
        if key not in schema:
            known = ", ".join(sorted(k for k in schema if not k.startswith("_")))
            raise ConfigError(f"{name}: unknown key (not in {source}; known: {known})")
        ref = schema[key]
        if isinstance(ref, str) and "${" in ref:  # an interpolation: typed where it points
            continue
        if name in ALTERNATIVES:
            if not any(_fits(value, alt) for alt in ALTERNATIVES[name]):
                raise ConfigError(f"{name}={value!r}: expected one of {', '.join(map(str, ALTERNATIVES[name]))} "
                                  f"or false (as in {source})")
            continue
        if isinstance(ref, dict) and isinstance(value, dict):
            _check(name, value, ref, source)
        elif not _fits(value, ref):
            raise ConfigError(f"{name}={value!r}: expected {_kind(ref)} (as in {source})")


def _yaml(path: Path) -> dict:
    """The config file's keys (a copy: callers edit it), parsed once per version of the file (a sweep checks every
    job against the same few files)."""
    return copy.deepcopy(_parsed(path, path.stat().st_mtime_ns))


@functools.lru_cache(maxsize=None)
def _parsed(path: Path, mtime_ns: int) -> dict:
    data = OmegaConf.to_container(OmegaConf.load(path), resolve=False)
    data.pop("defaults", None)
    return data


def method_schema(name: str) -> tuple[dict, str]:
    """A method's keys and typed defaults: the fields of its selector's Options (locks/core/options.py)."""
    from locks.core.registry import selector_class

    cls = selector_class(name)
    return {**METHOD_KEYS, **cls.Options.defaults()}, f"the options of {cls.Options.__module__}.{cls.Options.__name__}"


def check_config(cfg: DictConfig, choices: dict | None = None) -> None:
    """Raise ConfigError naming the first key of `cfg` that its schema does not have or types differently.
    `choices`: the config group files Hydra chose (hydra.runtime.choices); groups without a choice are not checked."""
    config = OmegaConf.to_container(cfg, resolve=True)
    config.pop("hydra", None)
    choices = dict(choices or {})
    top = _yaml(CONF / "config.yaml")
    top.pop("hydra", None)
    schema = {**top, **RUN_KEYS, "method": None, **{g: None for g in GROUPS}}
    experiment = choices.get("experiment")
    extra = {}
    if experiment:  # a preset may add keys anywhere; they are typed by the preset
        extra = _yaml(CONF / "experiment" / f"{experiment}.yaml")
        schema.update({k: v for k, v in extra.items() if k not in GROUPS and k != "method"})
    _check("", {k: v for k, v in config.items() if k not in GROUPS and k != "method"}, schema, "conf/config.yaml")
    if isinstance(config.get("budget"), int) and config["budget"] <= 0:
        raise ConfigError(f"budget must be a positive number of tokens (got {config['budget']})")
    for group in GROUPS:
        choice = choices.get(group)
        if choice and isinstance(config.get(group), dict):
            group_schema = _yaml(CONF / group / f"{choice}.yaml")
            group_schema.update(extra.get(group) or {})
            _check(group, config[group], group_schema, f"conf/{group}/{choice}.yaml")
    method = config.get("method")
    if isinstance(method, dict) and isinstance(method.get("name"), str):
        schema, source = method_schema(method["name"])
        _check("method", method, schema, source)
