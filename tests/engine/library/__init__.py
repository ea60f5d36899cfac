"""Tests of engine/library/: models found in other apps' folders, and the Library dialog that lists them."""
