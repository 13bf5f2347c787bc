"""The model families, one file each (``rsa``, ``rtransformer``, ``vanilla``, ``rmt``, ``srformer``), and
what they share (MiniLM, checkpoints, the segment contract, the text cutter, the decoder search).

Subpackages, one job each: ``models.data`` (corpora), ``models.training`` (recipes),
``models.serving`` (the graphs export writes). Nothing here knows about HTTP or Redis.
"""
