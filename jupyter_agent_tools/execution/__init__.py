"""Eval: run Python cells in kernels of the server's kernel manager."""
