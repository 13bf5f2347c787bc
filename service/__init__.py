"""The HTTP service: FastAPI app, sessions, runtime, metrics.

Layers, top to bottom: routers -> runtime (batcher, backends) -> state store.
"""
