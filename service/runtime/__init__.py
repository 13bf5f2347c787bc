"""Runtime: model repository, backends (ONNX Runtime, TorchScript, eager PyTorch), dynamic batcher, pipelines."""
