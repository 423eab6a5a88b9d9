"""Packaging for keras-precrop.

TensorFlow is deliberately not a hard requirement: it ships as several
distributions (``tensorflow``, ``tensorflow-cpu``, ``tensorflow[and-cuda]``,
``tensorflow-tpu``) that pip treats as different packages, so requiring one of
them would force a second, conflicting TensorFlow onto users who already have
another (Colab, TPU VMs, CUDA images). Pick one with an extra: ``[cpu]``,
``[gpu]`` or ``[tf]``. The core (profile, plans, rebuilds, pruners, training)
runs on any Keras backend: ``[jax]`` and ``[torch]`` install the others.
TensorFlow Datasets comes with the TensorFlow extras, as only the
TensorFlow-based ``keras_precrop.data`` uses it, together with
``importlib_resources``, which TFDS imports when it downloads and prepares a
dataset (``kp.data.load(..., download=True)``) without requiring it.
``[docs]`` installs what builds the API reference (``mkdocs build --strict``).

``[litert]`` and ``[onnx]`` add the runtimes a latency model can time
besides the backend's own (LiteRT also runs on TensorFlow's ``tf.lite``).
The ``[test]`` extra installs all three backends and ONNX Runtime so the
suite checks each, and what ``import keras_hub`` needs (``regex``, ``rich``,
``packaging``): keras_hub itself is installed with ``pip install --no-deps
keras-hub tokenizers``, since its own requirements pull ``tensorflow-text``
and with it a second TensorFlow (``kagglehub`` only downloads presets, which
the tests do not use);
it pins ``torch==2.13.0`` because that is the CPU build this project's
machines have on disk: an unpinned ``torch`` resolves to a newer CUDA build
of several GB there.
"""

from setuptools import find_packages, setup

# TensorFlow Datasets and what it imports to download a dataset but does not require.
TFDS = ["tensorflow-datasets>=4.9", "importlib_resources"]
# The API reference: mkdocs.yml; tests/test_docs.py runs `mkdocs build --strict`.
DOCS = ["mkdocs>=1.6,<2", "mkdocstrings[python]>=1.0"]

setup(
    name="keras-precrop",
    version="0.1.0",
    description=(
        "Structured pruning (PreCrop) and width reconfiguration (PreConfig) of "
        "Keras 3 models, CNNs and transformers, at initialization or trained."
    ),
    long_description=open("README.md", encoding="utf-8").read(),
    long_description_content_type="text/markdown",
    license="Apache-2.0",
    packages=find_packages(include=["keras_precrop", "keras_precrop.*"]),
    python_requires=">=3.10",
    install_requires=[
        "keras>=3.4,<4",
        "scipy>=1.10",
        "absl-py>=1.0",
        "numpy>=1.24",
    ],
    extras_require={
        "cpu": ["tensorflow-cpu>=2.16", "tensorboard", *TFDS],
        "gpu": ["tensorflow[and-cuda]>=2.16", *TFDS],
        "tf": ["tensorflow>=2.16", *TFDS],
        "jax": ["jax[cpu]"],
        "torch": ["torch"],
        # Runtimes a latency model can time (kp.latency_model(..., runtime=...)).
        "litert": ["ai-edge-litert"],
        "onnx": ["onnxruntime", "tf2onnx", "onnx"],
        "test": [
            "tensorflow-cpu>=2.16",
            "tensorboard",
            *TFDS,
            "jax[cpu]",
            "torch==2.13.0",
            "onnxruntime",
            "tf2onnx",
            "onnx",
            "ai-edge-litert",  # README's deployment serves with it (and the litert runtime times it)
            "pytest>=7",
            "pytest-xdist>=3",  # the suite runs on two workers: most tests use one core
            "hypothesis>=6",
            "ruff>=0.6",
            "nbformat>=5",
            "ipython",
            "matplotlib>=3.5",
            # What `import keras_hub` needs besides Keras and TensorFlow; keras_hub itself
            # is installed with --no-deps (see README's test command).
            "regex",
            "rich",
            "packaging",
            *DOCS,
        ],
        "docs": DOCS,
        "examples": ["matplotlib>=3.5", "importlib_resources"],
    },
    entry_points={"console_scripts": ["keras-precrop=keras_precrop.cli:main"]},
    classifiers=[
        "License :: OSI Approved :: Apache Software License",
        "Programming Language :: Python :: 3",
        "Topic :: Scientific/Engineering :: Artificial Intelligence",
    ],
)
