"""Training and evaluation recipes, one file per family (``rtserve train`` / ``rtserve eval <checkpoint>``).

Recipes import families (``models.<family>``) and corpora (``models.data``); nothing that serves
imports a recipe.
"""
