"""Oculis' one schema: the CRD models, the router configuration and the Python API."""

__version__ = "0.1.0"
