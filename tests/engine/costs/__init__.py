"""Tests of engine/costs/: cost curves, CPUs and threads, contention, measuring, what-if curves."""
