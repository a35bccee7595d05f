"""Prompt caching: whether provider caching pays for observed traffic."""
