"""PyTorch definitions of the four model families and their training recipes.

Nothing here knows about HTTP or Redis.
"""
