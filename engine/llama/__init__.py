"""llama.cpp and model files: the native bindings, GGUF headers and checks, the load probe, test shapes."""
