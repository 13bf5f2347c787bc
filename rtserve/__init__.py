"""rtserve: a model server for recurrent transformers."""

from importlib.metadata import version

__version__ = version("rtserve")  # pyproject.toml's, as installed
