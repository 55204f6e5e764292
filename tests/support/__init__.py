"""Helpers shared by the test modules (workloads, staged-batch writers, kill points, the crash tests' child
processes, a real S3 server). The services the benchmarks and the demo need too live in ``scripts/harness/``."""
