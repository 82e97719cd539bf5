"""ONNX Runtime as a deployment runtime: ``export`` (ONNX export, offline optimization), ``graph`` (which node applies
which weight), ``fusion`` (attention as one fused node), ``quantize`` (dynamic and static int8), ``session``
(OrtModel, the paper's ONNX Runtime baseline), ``backend`` (the ``onnxruntime*`` backends of the registry)."""
