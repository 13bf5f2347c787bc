"""Serving adapters: a trained checkpoint cut into the named step graphs that export writes and the
service runs (``build_servable``), one file per task family.
"""
