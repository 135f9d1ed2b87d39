"""Benchmark fixtures: real KV data from ../shared/kvdata (or $KVCORE_KVDATA), codecs, and the
summary table.

Run: ``python -m pytest bench/ --benchmark-only`` (a few minutes on 2 cores). Each data file's
tensors are joined into one contiguous tensor (kvcore.bench.data.load_kv_file); fp8 (e4m3,
e5m2, with a per-tensor scale) and fp32 inputs are derived from each model's fp16 file by
casting. At the end a table gives per input and codec the ratio and GB/s of original bytes
(original_bytes / mean time), and the issue's targets, marked met / NOT met; after it, when
test_mover_bench.py ran, the data mover's one-thread pairs and its all-threads speeds.
"""

from __future__ import annotations

from typing import Any

import pytest
import torch

from kvbench import THREADS_INPUT_BYTES, Paired, Row, kv_inputs, load_input, mover_summary_lines, summary_lines
from kvcore.bench.data import repeat_to_size


def timer_name(config: pytest.Config) -> str:
    """The timer pytest-benchmark uses (--benchmark-timer), e.g. "time.perf_counter"."""
    try:
        return str(config.getoption("benchmark_timer"))
    except ValueError:
        return "time.perf_counter"


@pytest.fixture(scope="session")
def cpu_timer(request: pytest.FixtureRequest) -> bool:
    """True when benchmarks are timed in CPU time of the process (time.process_time)."""
    return "process_time" in timer_name(request.config)


@pytest.fixture(scope="session")
def threads_input() -> torch.Tensor:
    """64 MiB of real bf16 KV (the largest bf16 file, repeated along the token axis)."""
    bf16 = [i for i in kv_inputs() if i.dtype == "bf16" and not i.half]
    if not bf16:
        pytest.skip("../shared/kvdata has no bf16 file")
    biggest = max(bf16, key=lambda i: i.path.stat().st_size)
    return repeat_to_size(load_input(biggest), THREADS_INPUT_BYTES)


_RESULTS_KEY = pytest.StashKey[list]()
_PAIRED_KEY = pytest.StashKey[list]()
_MOVER_KEY = pytest.StashKey[list]()


@pytest.fixture(scope="session")
def kv_results(request: pytest.FixtureRequest) -> list[Row]:
    """Rows of finished benchmarks, printed by pytest_terminal_summary."""
    return request.config.stash.setdefault(_RESULTS_KEY, [])


@pytest.fixture(scope="session")
def kv_paired(request: pytest.FixtureRequest) -> list[Paired]:
    """Targets measured paired (test_paired_targets), printed after the summary table."""
    return request.config.stash.setdefault(_PAIRED_KEY, [])


@pytest.fixture(scope="session")
def kv_mover(request: pytest.FixtureRequest) -> list[Row]:
    """Rows of the data mover's benchmarks (test_mover_bench.py), printed after the codec summary."""
    return request.config.stash.setdefault(_MOVER_KEY, [])


def pytest_terminal_summary(terminalreporter: Any, exitstatus: int, config: pytest.Config) -> None:
    rows = config.stash.get(_RESULTS_KEY, [])
    paired = config.stash.get(_PAIRED_KEY, [])
    mover = config.stash.get(_MOVER_KEY, [])
    if not rows and not paired and not mover:
        return
    terminalreporter.section("kvcore benchmark summary")
    timer = timer_name(config)
    note = (" (CPU time of this process: steadier on a busy machine)" if "process_time" in timer
            else " (wall clock; on a busy machine try --benchmark-timer=time.process_time)")
    terminalreporter.write_line(f"timer: {timer}{note}")
    if rows or paired:
        for line in summary_lines(rows, paired):
            terminalreporter.write_line(line)
    if mover:
        for line in mover_summary_lines(mover):
            terminalreporter.write_line(line)
