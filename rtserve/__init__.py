"""rtserve: a model server for recurrent transformers."""

__version__ = "0.1.0"
