"""Runs the pai pruners and masked training on given weights; writes what they give to an .npz.

Usage: ``python pruners.py INPUTS.npz OUTPUT.npz [MASKED.keras]`` under any
Keras backend. ``tests/test_backends.py`` writes the inputs under TensorFlow
(the weights of ResNet-20 and of a small CNN, a data batch), runs this under
JAX and PyTorch, and compares the masks and scores with TensorFlow's own;
``MASKED.keras`` is the masked model TensorFlow trained and saved, which the
other backends load and run.
"""

import sys

import keras
import numpy as np

from keras_precrop import models, pai


def small_cnn():
    """Conv-BN-ReLU, a second conv, global pooling and a dense head, on 8x8x3 inputs."""
    inputs = keras.Input((8, 8, 3))
    x = keras.layers.Conv2D(8, 3, padding="same", use_bias=False, name="c1")(inputs)
    x = keras.layers.BatchNormalization(name="bn1")(x)
    x = keras.layers.ReLU()(x)
    x = keras.layers.Conv2D(8, 3, padding="same", name="c2")(x)
    x = keras.layers.GlobalAveragePooling2D()(x)
    return keras.Model(inputs, keras.layers.Dense(3, name="fc")(x))


def with_weights(model, inputs, prefix):
    """``model`` with the weights stored in ``inputs`` under ``prefix`` + index."""
    model.set_weights([inputs[f"{prefix}{i}"] for i in range(len(model.weights))])
    return model


def flat(arrays):
    return np.concatenate([np.ravel(a) for a in arrays.values()])


def run(inputs, path, saved=None):
    """Scores and masks of every pruner, after checking masked training keeps its zeros.

    The masked model is saved as ``path + ".keras"``; ``saved``, a masked model
    saved by another backend, is loaded and run on the same batch.
    """
    resnet = with_weights(models.get("resnet20"), inputs, "resnet")
    cnn = with_weights(small_cnn(), inputs, "cnn")
    x, y = inputs["x"], inputs["y"]
    synflow = pai.synflow(resnet, 0.05, iterations=int(inputs["synflow_iterations"]), verbose=0)
    out = {
        "synflow": flat(synflow),
        "synflow_densities": np.array(list(pai.layer_densities(synflow).values())),
        "snip": flat(pai.snip_scores(cnn, (x, y))),
        "grasp": flat(pai.grasp_scores(cnn, (x, y))),
        "magnitude": flat(pai.magnitude(cnn, 0.3)),
    }
    masks = pai.snip(cnn, (x, y), 0.3)
    pai.apply_masks(cnn, masks)
    cnn.compile(
        optimizer=keras.optimizers.SGD(0.05, momentum=0.9, weight_decay=1e-3),
        loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True),
    )
    history = cnn.fit(x, y, batch_size=4, epochs=2, shuffle=False, verbose=0)
    cnn.save(path + ".keras")
    loaded = keras.saving.load_model(path + ".keras")
    loaded.fit(x, y, batch_size=4, epochs=1, shuffle=False, verbose=0)
    for model in (cnn, loaded):
        weights = {v.path: v.numpy() for v in model.weights}
        for name, mask in masks.items():
            assert np.all(weights[name][mask == 0] == 0), f"{name} lost its mask"
        assert isinstance(model.get_layer("c2").kernel.constraint, pai.MaskConstraint)
    out["masked_fit_loss"] = np.array(history.history["loss"])
    out["masked_kernel"] = cnn.get_layer("c2").kernel.numpy()
    out["masked_outputs"] = keras.ops.convert_to_numpy(cnn(x))
    if saved is not None:
        other = keras.saving.load_model(saved)
        assert isinstance(other.get_layer("c2").kernel.constraint, pai.MaskConstraint)
        out["reloaded_outputs"] = keras.ops.convert_to_numpy(other(x))
    np.savez(path, **out)


if __name__ == "__main__":
    with np.load(sys.argv[1]) as data:
        run(dict(data), *sys.argv[2:])
