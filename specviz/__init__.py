"""specviz: exact speculative decoding you can watch, check and measure."""

from importlib import import_module
from importlib.util import find_spec

__all__ = ["Pair", "RoundEvent", "RunStats", "SamplingParams", "generate", "load_pair"]
__version__ = "0.1.0"

# where each name of the API lives: imported on first use (PEP 562), so that `python -m specviz
# --help` and other light imports of the package do not load torch and transformers first (seconds)
_HOMES = {"Pair": "loading", "load_pair": "loading", "RoundEvent": "engine", "generate": "engine",
          "RunStats": "metrics", "SamplingParams": "sampling"}


def __getattr__(name: str):
    if name in _HOMES:
        value = getattr(import_module(f".{_HOMES[name]}", __name__), name)
    elif not name.startswith("_") and find_spec(f"{__name__}.{name}") is not None:
        value = import_module(f".{name}", __name__)  # specviz.engine after `import specviz`, as before
    else:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted({*globals(), *__all__})
