"""Tests of engine/speed/: one run's statistics, speedups and their roll-ups."""
