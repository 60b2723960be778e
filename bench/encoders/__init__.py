"""Benchmark cases for bench/bench_encoders.py, one module per architecture.

Each module defines:
    DESCRIPTION: str                                  what is measured, e.g. "UNITER-base VQA"
    DEFAULT_REGIONS: int (optional, default 36)      regions per example when --regions is not given
    build(attn_implementation: str) -> nn.Module      the model at its released size, random weights, eval mode
    make_inputs(model, batch, text, regions) -> dict  keyword arguments of model(**inputs)
"""
