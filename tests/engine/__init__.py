"""Tests of engine/: a folder per package; tests of engine/documents.py and of the engine offline here."""
