"""The training wing: recipes and strategies (``train``), TFDS pipelines (``data``),
the paper's optimizer (``optimizers``) and the mask constraint of masked training
(``constraints``).

``train`` and ``data`` need TensorFlow for some of their work and are imported
on first use (``kp.train``, ``kp.data``); ``optimizers`` and ``constraints`` are
plain Keras and register their serializable classes when the package loads.
"""
