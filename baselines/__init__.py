"""Baseline selectors, one module (or package, when it has its own kernels) per method; importing this package
imports each of them, which registers it by name (locks/core/registry.py). Kernel modules are not imported here."""
import importlib
import pkgutil

for _module in pkgutil.iter_modules(__path__):
    importlib.import_module(f"{__name__}.{_module.name}")
