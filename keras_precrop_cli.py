"""Console-script shim for ``keras-precrop``.

It lives outside the package so that TensorFlow's C++ start-up banners
(oneDNN, absl), which ignore ``TF_CPP_MIN_LOG_LEVEL``, can be muted before
``keras_precrop`` imports TensorFlow: a command-line tool should print only
its table and, on failure, one error line.
"""

import os
import sys


def _import_tensorflow_quietly():
    """Import TensorFlow with stderr muted at the file-descriptor level."""
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")
    sys.stderr.flush()
    saved, devnull = os.dup(2), os.open(os.devnull, os.O_WRONLY)
    os.dup2(devnull, 2)
    try:
        import tensorflow  # noqa: F401
    except ImportError:
        pass  # keras_precrop raises a helpful error on import
    finally:
        os.dup2(saved, 2)
        os.close(saved)
        os.close(devnull)


def main():
    """Run ``keras_precrop.cli.main`` after a quiet TensorFlow import."""
    _import_tensorflow_quietly()
    from keras_precrop.cli import main as cli_main

    return cli_main()


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
