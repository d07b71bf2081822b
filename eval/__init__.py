"""Benchmarks: prompt generation / loading and official scorers."""
