"""Tests of the project as a whole: the engine's import layers, Qt kept out of the engine, one home for each fact."""
