"""Baseline selectors, one module per method; importing this package registers every one of them by name."""
import importlib
import pkgutil

for _module in pkgutil.iter_modules(__path__):
    importlib.import_module(f"{__name__}.{_module.name}")
