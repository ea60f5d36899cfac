"""Tests of engine/server/: over raw HTTP, through the openai client, and from the command line."""
