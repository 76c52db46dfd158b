"""specviz: exact speculative decoding you can watch, check and measure."""

from .engine import RoundEvent, generate
from .loading import Pair, load_pair
from .metrics import RunStats
from .sampling import SamplingParams

__all__ = ["Pair", "RoundEvent", "RunStats", "SamplingParams", "generate", "load_pair"]
__version__ = "0.1.0"
