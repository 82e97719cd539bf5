"""OpenVINO as a deployment runtime: ``convert`` (IR), ``quantize`` (NNCF int8), ``model`` (OpenVinoModel, the IR
compiled for the CPU), ``backend`` (``openvino`` and ``openvino-int8`` of the registry)."""
