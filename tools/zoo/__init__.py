"""Plain-PyTorch model definitions whose factories can be passed as ``--model module:factory``.

``tools.zoo.cifar_resnet:resnet20`` (also ``resnet32``, ``resnet44``, ``resnet56``) builds the CIFAR
ResNets of He et al. (2016), section 4.2, with the parameter names of the widely used checkpoints
(``conv1``, ``bn1``, ``layer1..3``, ``linear``).
"""
