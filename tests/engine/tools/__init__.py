"""Tests of engine/tools/: the command line, the benches, the soak, model shapes."""
