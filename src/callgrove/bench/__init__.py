"""The one benchmark: every stage at three sizes, side by side with verifiers, NeMo Gym and the
numpy floor, on the same synthetic episodes in the same run."""

from callgrove.bench.suite import BenchSettings, Measurement, Report, run_bench, stream_case

__all__ = ["BenchSettings", "Measurement", "Report", "run_bench", "stream_case"]
