"""The training wing: recipes and strategies (``train``), TFDS pipelines (``data``),
the paper's optimizer (``optimizers``), the mask constraint of masked training
(``constraints``) and fine-tuning with distillation (``finetune``).

``train`` and ``data`` need TensorFlow for some of their work and are imported
on first use (``kp.train``, ``kp.data``); ``optimizers`` and ``constraints`` are
plain Keras and register their serializable classes when the package loads, and
``finetune`` (``kp.fine_tune``) is plain Keras too.
"""
