"""What a benchmark, or a user timing a run, measures on and with: the device, threads, CPU
seconds, memory.

These are the library's own instruments (``bench``, ``select`` and the sharded workers use
them), implemented once in the private :mod:`datamask._device` and :mod:`datamask._memory`;
this module is their public name. Benchmark scripts import them from here, never from a
private module (``tests/test_benchmarks.py`` checks).

>>> from datamask.measure import cpu_seconds, measure_peak_rss
>>> result, memory = measure_peak_rss(lambda: sum(range(1000)))
>>> result, sorted(memory), cpu_seconds() > 0
(499500, ['memory_method', 'peak_mb', 'rss_before_mb'], True)
"""

from ._device import resolve_device, set_threads
from ._memory import (
    bound_heap,
    cpu_seconds,
    load_average,
    measure_peak_rss,
    peak_rss_mb,
    rss_mb,
)

__all__ = [
    "bound_heap",
    "cpu_seconds",
    "load_average",
    "measure_peak_rss",
    "peak_rss_mb",
    "resolve_device",
    "rss_mb",
    "set_threads",
]
