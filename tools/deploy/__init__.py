"""Deployment: every runtime and precision a model is deployed in, behind one registry, and the measured choice.

Modules, each importing only ones listed above it:

* ``base`` -- what a backend is: the description it declares (Deployment), the protocol it implements
  (QuantizationBackend, ModuleBackend), QuantReport, QuantizationError.
* ``pytorch`` -- the float model as it is (``torch``) and ``torch-ao-dynamic``.
* ``onnxruntime/`` -- export, graph (which node applies which weight), fusion (fused attention), quantize
  (dynamic and static int8), session (OrtModel, the ONNX Runtime baseline), backend (the ``onnxruntime*`` backends).
* ``openvino/`` -- convert (IR), quantize (NNCF int8), model (OpenVinoModel), backend (``openvino``, ``openvino-int8``).
* ``registry`` -- BACKENDS, the one list of backends, and what is derived from it: choices, availability, runtime
  and precision, float references, ``auto``'s two meanings; quantization plans.
* ``config`` -- QuantizationConfig, validated against the registry.
* ``choice`` -- the measured choice: candidates, and the fastest within budget.
* ``speedup`` -- a deployed model's speed-up as runtime x precision x pruning.
"""
