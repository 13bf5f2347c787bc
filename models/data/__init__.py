"""Corpora and their readers: splits, cleaning, windows, and the task metrics computed on them.

Nothing here imports a model family or torch-side training code; training recipes
(``models.training``) and ``rtserve eval`` of an exported entry both read data from here.
"""
