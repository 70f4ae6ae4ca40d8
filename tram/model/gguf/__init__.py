"""GGUF files (llama.cpp's format): the reader, the file as a model config, the loader that keeps
quantized blocks in their layout, the weights that multiply by them, and the RoPE factors they carry."""
