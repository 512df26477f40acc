"""Benchmarks: measurements printed side by side, never asserted in tests."""
