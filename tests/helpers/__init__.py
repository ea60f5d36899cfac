"""Code the tests share: the app's fixtures (a pytest plugin the top conftest loads), damaged and tiny model
files, documents, planning curves, the GUI-thread watch, and the docs' screenshots."""
