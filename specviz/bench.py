"""Benchmark placeholder args; filled in by the benchmark issue."""


def add_bench_args(p):
    pass
