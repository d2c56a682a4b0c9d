"""Benchmarking speculative decoding: Spec-Bench prompts, methods interleaved per prompt, JSON/markdown/PNG reports."""

from specheads.bench.cli import bench_main, run_bench
from specheads.bench.questions import MT_BENCH, Question, load_questions, select_per_category, spec_bench_category
from specheads.bench.report import aggregate, markdown_report, write_report
from specheads.bench.runner import Record, run_benchmark
from specheads.bench.settings import BenchSettings

__all__ = [
    "MT_BENCH",
    "BenchSettings",
    "Question",
    "Record",
    "aggregate",
    "bench_main",
    "load_questions",
    "markdown_report",
    "run_bench",
    "run_benchmark",
    "select_per_category",
    "spec_bench_category",
    "write_report",
]
