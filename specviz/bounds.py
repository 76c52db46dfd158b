"""The drafters' names and the bounds of their settings, with no import of torch: the command
line's parser (`python -m specviz --help`, `run --help`) is built from these in a fraction of a
second, where importing the engine for them loaded torch and transformers first (seconds)."""

MAX_K = 32
PROPOSERS = ("draft", "ngram", "none", "hybrid", "adaptive", "tree")
NEEDS_DRAFT = ("draft", "hybrid", "adaptive", "tree")

MAX_NODES = 64
MAX_BRANCHING = 8
BRANCHING = 3  # children of each expanded node; with branching unset, the width a run starts at
