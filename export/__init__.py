"""Turns a trained checkpoint into a model-repository entry (TorchScript / ONNX graphs + manifest)."""
