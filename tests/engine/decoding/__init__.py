"""Tests of engine/decoding/: the plan, the n-gram pool, drafts, Auto, text, decoding on real models."""
