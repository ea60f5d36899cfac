"""The model library: GGUF files already on disk in the folders where other apps keep them."""
