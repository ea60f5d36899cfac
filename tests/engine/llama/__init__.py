"""Tests of engine/llama/: model files checked and probed, bad inputs refused, the memory check."""
