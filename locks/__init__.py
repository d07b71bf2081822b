"""Sparse KV-cache decode attention: the selector interface, LOCKS, and the transformers integration."""
