"""Tests of packaging/: the llama.cpp build in use, its patched batch kernels, and the bundle."""
