"""The Triton side of ``rtserve bench --only triton``: :mod:`.model` (the python-backend model serving an exported
step graph, state per correlation id), :mod:`.repository` (the Triton model repository written from rtserve's
entries) and :mod:`.server` (the peer venv and the ``tritonserver`` process)."""
