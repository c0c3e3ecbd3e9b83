"""Benchmarks that ship with edged, behind `edged bench`: matmul kernels (kernels), the engine
in-process (engine, with the step profiler in profile) and any OpenAI-compatible server (serve)."""
