"""The commands of ``python -m engine``, one module each: generate, bench, tune, chat and shape (serve's is
engine/tools/serve.py). common.py holds what they share; engine/tools/cli.py puts them on the command line."""
