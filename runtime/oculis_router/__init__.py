"""Oculis data plane: the OpenAI-compatible routing proxy."""
