"""Code the tests share: the app's fixtures (a pytest plugin the top conftest loads), the comparison tests' fake
engine (checked by mypy against the engine it fakes), damaged and tiny model files, documents, planning curves, the
GUI-thread watch, values that may be None (``optional.present``), and the docs' screenshots."""
