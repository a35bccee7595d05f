"""The `oculis` command line."""
