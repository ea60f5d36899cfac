"""The command-line tools behind ``python -m engine``: bench, the busy bench, tune, the soak test."""
