"""Command-line tools: benchmark, tuner, CPU demo."""
