"""``python -m keras_precrop``: the same as the ``keras-precrop`` command."""

import sys

from keras_precrop.cli import main

sys.exit(main())
