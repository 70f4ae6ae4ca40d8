"""The C++ CPU kernels: their sources (csrc/), the just-in-time build with its progress log, and
the Python entry points that call them."""
