"""``import keras_precrop``: light, and enough to load what the package saves.

Each check runs in a fresh interpreter, where only what the package itself
imports is loaded.
"""

import importlib
import json

import keras
import numpy as np

import keras_precrop as kp
from keras_precrop import pai, train
from tests.conftest import run_python

L = keras.layers


def _python(code):
    """Run ``code`` in a fresh interpreter; returns its last line of output."""
    done = run_python(["-c", code])
    assert done.returncode == 0, done.stderr[-3000:]
    return done.stdout.strip().splitlines()[-1]


def test_profiling_loads_no_pipeline_or_baseline_and_subpackages_load_on_use():
    loaded, used = json.loads(_python(
        "import json, sys\n"
        "import keras_precrop as kp\n"
        "kp.profile(kp.models.get('resnet20'))\n"
        "names = ('tensorflow_datasets', 'keras_precrop.data', 'keras_precrop.train',\n"
        "         'keras_precrop.pai', 'keras_precrop.pai.synflow', 'keras_hub')\n"
        "loaded = {n: n in sys.modules for n in names}\n"
        "from keras_precrop import data\n"
        "used = [callable(kp.pai.synflow), kp.train.SGDWithL2.__name__, data is kp.data,\n"
        "        'pai' in dir(kp), not {'sys', 'importlib'} & set(dir(kp))]\n"
        "print(json.dumps([loaded, used]))\n"))
    assert loaded == dict.fromkeys(loaded, False) and len(loaded) == 6
    assert used == [True, "SGDWithL2", True, True, True]  # dir(): the API, not its imports


def _residual_model():
    keras.utils.set_random_seed(0)
    x = keras.Input((8, 8, 3))
    stem = L.Conv2D(8, 3, padding="same", name="stem")(x)
    h = L.Conv2D(8, 3, padding="same", name="a")(L.ReLU(name="relu")(stem))
    s = L.Add(name="add")([stem, h])
    h = L.Conv2D(8, 3, padding="same", name="b")(s)
    return keras.Model(x, L.Dense(3, name="head")(L.GlobalAveragePooling2D(name="gap")(h)))


def test_saved_models_load_after_a_bare_import(tmp_path):
    """Rebuilt (ChannelSlice, PrefixAdd), masked (MaskConstraint) and checkpointed (SGDWithL2)."""
    rebuilt = kp.precrop(_residual_model(), params=0.4)
    classes = {type(layer).__name__ for layer in rebuilt.layers}
    assert {"ChannelSlice", "PrefixAdd"} <= classes
    rebuilt.save(tmp_path / "rebuilt.keras")
    masked = _residual_model()
    masks = pai.magnitude(masked, 0.5)
    pai.apply_masks(masked, masks)
    masked.compile(optimizer=train.SGDWithL2(l2=1e-4, learning_rate=0.1, momentum=0.9), loss="mse")
    masked.fit(np.ones((4, 8, 8, 3)), np.zeros((4, 3)), verbose=0)
    masked.save(tmp_path / "masked.keras")
    x = np.random.default_rng(0).normal(size=(2, 8, 8, 3)).astype("float32")
    np.save(tmp_path / "x.npy", x)
    result = json.loads(_python(
        "import json, pathlib\n"
        "import keras, numpy as np\n"
        "import keras_precrop\n"
        f"root = pathlib.Path({str(tmp_path)!r})\n"
        "x = np.load(root / 'x.npy')\n"
        "rebuilt = keras.models.load_model(root / 'rebuilt.keras')\n"
        "masked = keras.models.load_model(root / 'masked.keras')\n"
        "kernel = masked.get_layer('a').kernel\n"
        "print(json.dumps({'rebuilt': np.asarray(rebuilt(x)).tolist(),\n"
        "                  'masked': np.asarray(masked(x)).tolist(),\n"
        "                  'constraint': type(kernel.constraint).__name__,\n"
        "                  'optimizer': type(masked.optimizer).__name__}))\n"))
    np.testing.assert_allclose(result["rebuilt"], rebuilt(x), rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(result["masked"], masked(x), rtol=1e-5, atol=1e-6)
    assert result["constraint"] == "MaskConstraint" and result["optimizer"] == "SGDWithL2"


def test_the_plan_function_and_the_planning_module_have_their_own_names():
    planning = importlib.import_module("keras_precrop.planning")
    assert kp.planning is planning and kp.plan is planning.plan
    assert isinstance(kp.plan(_residual_model(), params=0.5), kp.Plan)


def test_every_public_name_loads_as_the_first_one_used():
    """Each public name and subpackage as the first use of a fresh package, Keras not loaded
    (each round forgets both; NumPy's backend keeps a round light): ``kp.GradualPruning`` first
    once failed with a circular import (``plans``' ``from keras_precrop import _json`` registered
    the hub's classes part-way through ``plans``)."""
    failed = json.loads(_python(
        "import json, os, sys\n"
        "os.environ['KERAS_BACKEND'] = 'numpy'\n"
        "failed, names, attempt = {}, None, 0\n"
        "while names is None or attempt < len(names):\n"
        "    for module in [m for m in sys.modules if m.split('.')[0] in ('keras', 'keras_precrop')]:\n"
        "        del sys.modules[module]\n"
        "    import keras_precrop as kp\n"
        "    names = names or sorted(kp._PUBLIC) + sorted(kp._SUBPACKAGES)\n"
        "    try:\n"
        "        getattr(kp, names[attempt])\n"
        "    except Exception as err:\n"
        "        failed[names[attempt]] = repr(err)\n"
        "    attempt += 1\n"
        "print(json.dumps([failed, attempt]))\n"))
    assert failed == [{}, len(kp._PUBLIC) + len(kp._SUBPACKAGES)]
