"""Deployment runtimes: ONNX export, ONNX Runtime quantization and inference (``onnxruntime``)."""
