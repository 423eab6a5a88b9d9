"""Channel-coupling groups of small hand-built models (MorphNet-style stubs).

Each test builds a stub, pins which layers share a width variable (through the
profile's ``in_variables``/``out_variables`` names and the variables' ``kind``,
``fixed`` and ``bound``), and then proves the claimed structure with costs:
the cost model evaluated at changed widths must equal ``count_params()`` and
TensorFlow's graph MACs of the same stub rebuilt by hand with those widths.
"""

import keras
import pytest
from keras import layers as L
from keras import ops

import keras_precrop as kp
from tests.conftest import assert_matches_plan, tf_macs  # TensorFlow-graph MAC reference

IMG = "input:img"  # the group of a keras.Input named "img"


def _rows(prof):
    return {row.name: row for row in prof.layers}


def _variable(prof, name):
    """The one width variable called ``name``, with its index."""
    found = [(i, g) for i, g in enumerate(prof.variables) if g.name == name]
    assert len(found) == 1, (name, [g.name for g in prof.variables])
    return found[0]


def _assert_costs_match(prof, changes, reference):
    """Cost model at ``changes`` (variable name -> width) == the hand-built model."""
    names = {g.name for g in prof.variables}
    assert set(changes) <= names, set(changes) - names
    widths = [changes.get(g.name, g.width) for g in prof.variables]
    params, macs = prof.cost.totals(widths)
    assert params == reference.count_params()
    assert macs == tf_macs(reference)


def _assert_unchanged(prof, model):
    assert prof.total_params == model.count_params()
    assert prof.total_macs == tf_macs(model)


def _take(t, k):
    """The first ``k`` channels of ``t`` (a residual reader's view)."""
    return t if k == t.shape[-1] else t[..., :k]


def _pad(t, k):
    """``t`` zero-padded to ``k`` channels (a narrow residual writer)."""
    c = t.shape[-1]
    return t if k == c else ops.pad(t, [[0, 0]] * (len(t.shape) - 1) + [[0, k - c]])


def _head(h, units=3):
    return L.Dense(units, name="head")(L.GlobalAveragePooling2D(name="gap")(h))


# ---------------------------------------------------------------------------
# Residual streams.


def _residual_chain(stem=16, a1=8, b1=16, a2_in=16, a2=8, b2=16, head_in=16):
    """stem -> +[a1 -> b1] -> +[a2 -> b2] -> GAP -> head.

    With the defaults a plain Keras model; other widths slice readers' inputs
    and zero-pad writers' outputs, as PreCrop's prefix semantics do.
    """
    x = keras.Input((8, 8, 3), name="img")
    s = L.Conv2D(stem, 3, padding="same", name="stem")(x)
    h = L.Conv2D(a1, 3, padding="same", name="a1")(s)
    h = L.Conv2D(b1, 3, padding="same", name="b1")(h)
    s = L.Add(name="add1")([s, _pad(h, stem)])
    h = L.Conv2D(a2, 3, padding="same", name="a2")(_take(s, a2_in))
    h = L.Conv2D(b2, 3, padding="same", name="b2")(h)
    s = L.Add(name="add2")([_pad(h, stem), s])  # the stream is not always first
    y = L.GlobalAveragePooling2D(name="gap")(s)
    return keras.Model(x, L.Dense(10, name="head")(_take(y, head_in)))


def test_residual_chain_prefix_mode():
    model = _residual_chain()
    prof = kp.profile(model)  # residual="prefix" is the default
    rows = _rows(prof)
    stream, g = _variable(prof, "stem")
    assert (g.kind, g.fixed, g.bound) == ("stream", False, None)
    # The creator (stem) and every Add output share the stream's variable.
    assert rows["stem"].out_variables == ["stem"]
    assert rows["add1"].out_variables == rows["add2"].out_variables == ["stem"]
    # Writers keep their own width, bounded by the stream.
    for writer in ("b1", "b2"):
        assert rows[writer].out_variables == [writer]
        assert _variable(prof, writer)[1].bound == stream
        assert _variable(prof, writer)[1].kind == "channels"
    assert rows["add1"].in_variables == ["stem", "b1"]
    assert rows["add2"].in_variables == ["b2", "stem"]
    # The first reader reads the whole stream; later readers get bounded views.
    assert rows["a1"].in_variables == ["stem"]
    for reader in ("a2", "head"):
        assert rows[reader].in_variables == [f"{reader}:in"]
        _, view = _variable(prof, f"{reader}:in")
        assert (view.kind, view.bound, view.fixed, view.width) == ("view", stream, False, 16)
    # Block-internal widths are free and unbounded; model input/output fixed.
    for inner in ("a1", "a2"):
        assert rows[inner].out_variables == [inner]
        assert _variable(prof, inner)[1].bound is None
    assert _variable(prof, IMG)[1].fixed and _variable(prof, "head")[1].fixed
    assert {g.name for g in prof.variables} == {
        IMG, "stem", "a1", "b1", "a2", "b2", "head", "a2:in", "head:in"}
    _assert_unchanged(prof, model)
    changes = {"stem": 12, "a1": 5, "b1": 7, "a2:in": 9, "a2": 6, "b2": 10, "head:in": 11}
    _assert_costs_match(prof, changes, _residual_chain(
        stem=12, a1=5, b1=7, a2_in=9, a2=6, b2=10, head_in=11))


def test_residual_chain_tie_mode():
    model = _residual_chain()
    prof = kp.profile(model, residual="tie")
    rows = _rows(prof)
    _, g = _variable(prof, "stem")
    assert (g.kind, g.fixed, g.bound) == ("stream", False, None)
    for name in ("stem", "b1", "b2", "add1", "add2", "gap"):
        assert rows[name].out_variables == ["stem"], name
    for reader in ("a1", "a2", "head"):
        assert rows[reader].in_variables == ["stem"]
    assert all(g.kind != "view" and g.bound is None for g in prof.variables)
    assert {g.name for g in prof.variables} == {IMG, "stem", "a1", "a2", "head"}
    _assert_unchanged(prof, model)
    _assert_costs_match(prof, {"stem": 12, "a1": 5, "a2": 6},
                        _residual_chain(stem=12, a1=5, b1=12, a2=6, b2=12, a2_in=12, head_in=12))


def test_projection_shortcut_creates_the_stream():
    """The shallowest of equally wide Add inputs (the 1x1 projection) creates it."""
    x = keras.Input((8, 8, 3), name="img")
    s = L.Conv2D(8, 3, padding="same", name="c0")(x)
    h = L.Conv2D(16, 3, strides=2, padding="same", name="a")(s)
    h = L.Conv2D(16, 3, padding="same", name="b")(h)
    shortcut = L.Conv2D(16, 1, strides=2, name="proj")(s)
    s = L.Add(name="add")([h, shortcut])
    model = keras.Model(x, _head(s))
    prof = kp.profile(model)
    rows = _rows(prof)
    stream, g = _variable(prof, "proj")
    assert g.kind == "stream" and rows["add"].out_variables == ["proj"]
    assert _variable(prof, "b")[1].bound == stream
    # c0 feeds two convs but is no residual stream: no views, no bound.
    _, c0 = _variable(prof, "c0")
    assert (c0.kind, c0.bound) == ("channels", None)
    assert rows["a"].in_variables == rows["proj"].in_variables == ["c0"]
    _assert_unchanged(prof, model)


# ---------------------------------------------------------------------------
# Concatenation.


def _dense_block(c0=6, c1=4, c2=5, c3=7):
    """DenseNet-like: two concatenations (the first includes the input), BN on each."""
    x = keras.Input((8, 8, 3), name="img")
    a = L.Conv2D(c0, 3, padding="same", name="c0")(x)
    b = L.Conv2D(c1, 3, padding="same", name="c1")(L.ReLU(name="r0")(a))
    cat1 = L.Concatenate(name="cat1")([x, a, b])
    d = L.BatchNormalization(name="bn1")(cat1)
    d = L.Conv2D(c2, 3, padding="same", name="c2")(L.ReLU(name="r1")(d))
    cat2 = L.Concatenate(name="cat2")([cat1, d])
    e = L.BatchNormalization(name="bn2")(cat2)
    e = L.Conv2D(c3, 1, name="c3")(e)
    return keras.Model(x, _head(e))


def test_concatenation_is_a_composite_of_its_inputs_groups():
    model = _dense_block()
    prof = kp.profile(model)
    rows = _rows(prof)
    first = [IMG, "c0", "c1"]
    assert rows["cat1"].out_variables == first
    assert rows["bn1"].in_variables == rows["bn1"].out_variables == first
    assert rows["c2"].in_variables == first
    assert rows["cat2"].out_variables == first + ["c2"]
    assert rows["bn2"].in_variables == rows["c3"].in_variables == first + ["c2"]
    assert rows["bn1"].params == 4 * (3 + 6 + 4)
    assert {g.name for g in prof.variables} == {IMG, "c0", "c1", "c2", "c3", "head"}
    assert not any(g.fixed for g in prof.variables if g.name in ("c0", "c1", "c2", "c3"))
    _assert_unchanged(prof, model)
    _assert_costs_match(prof, {"c0": 3, "c1": 2, "c2": 4, "c3": 5},
                        _dense_block(c0=3, c1=2, c2=4, c3=5))


# ---------------------------------------------------------------------------
# Depthwise, separable, transposed and 1-D convolutions.


def _depthwise_stub(pw=8, multiplier=1):
    x = keras.Input((8, 8, 3), name="img")
    h = L.Conv2D(pw, 1, name="pw")(x)
    h = L.DepthwiseConv2D(3, padding="same", depth_multiplier=multiplier, name="dw")(h)
    h = L.BatchNormalization(name="bn")(h)
    h = L.Conv2D(6, 1, name="proj")(L.ReLU(name="relu")(h))
    return keras.Model(x, _head(h))


@pytest.mark.parametrize("multiplier", [1, 2])
def test_depthwise_ties_input_and_output(multiplier):
    model = _depthwise_stub(multiplier=multiplier)
    prof = kp.profile(model)
    rows = _rows(prof)
    assert rows["dw"].in_variables == rows["dw"].out_variables == ["pw"]
    assert rows["bn"].in_variables == rows["proj"].in_variables == ["pw"]
    assert {g.name for g in prof.variables} == {IMG, "pw", "proj", "head"}
    assert rows["dw"].params == (9 + 1) * 8 * multiplier
    _assert_unchanged(prof, model)
    # Shrinking pw shrinks dw's output by multiplier x as much (proj's input).
    _assert_costs_match(prof, {"pw": 5}, _depthwise_stub(pw=5, multiplier=multiplier))


def test_mobilenet_v2_depthwise_layers_tie_their_channels():
    prof = kp.profile(keras.applications.MobileNetV2(
        weights=None, input_shape=(32, 32, 3), alpha=0.35, include_top=False))
    depthwise = [row for row in prof.layers if row.class_name == "DepthwiseConv2D"]
    assert len(depthwise) == 17
    for row in depthwise:
        assert row.in_variables == row.out_variables, row.name


def test_densenet121_convs_read_every_earlier_block_of_their_stage():
    prof = kp.profile(keras.applications.DenseNet121(
        weights=None, include_top=False, input_shape=(32, 32, 3)))
    rows = _rows(prof)
    earlier = ["conv1_conv"]
    for k in range(1, 7):
        assert rows[f"conv2_block{k}_1_conv"].in_variables == earlier
        assert rows[f"conv2_block{k}_0_bn"].out_variables == earlier
        earlier = earlier + [f"conv2_block{k}_2_conv"]
        assert rows[f"conv2_block{k}_concat"].out_variables == earlier
    assert rows["pool2_conv"].in_variables == earlier
    assert rows["conv3_block1_1_conv"].in_variables == ["pool2_conv"]


def test_efficientnet_b0_squeeze_excite_gates_tie_to_their_features():
    prof = kp.profile(keras.applications.EfficientNetB0(
        weights=None, include_top=False, input_shape=(32, 32, 3)))
    rows = _rows(prof)
    blocks = [name[:-len("_se_expand")] for name in rows if name.endswith("_se_expand")]
    assert len(blocks) == 16
    for block in blocks:
        features = rows[f"{block}_se_excite"].out_variables
        assert rows[f"{block}_se_excite"].in_variables == features * 2
        assert rows[f"{block}_se_reduce"].in_variables == features
        assert rows[f"{block}_se_expand"].out_variables == features
        assert rows[f"{block}_se_reduce"].out_variables == [f"{block}_se_reduce"]
    # The features are the depthwise conv's input: the expand conv, or the stem.
    assert rows["block1a_se_excite"].out_variables == ["stem_conv"]
    assert rows["block2a_se_excite"].out_variables == ["block2a_expand_conv"]


def _separable_stub(c=6, sep=5):
    x = keras.Input((8, 8, 3), name="img")
    h = L.Conv2D(c, 1, name="c")(x)
    h = L.SeparableConv2D(sep, 3, padding="same", depth_multiplier=2, name="sep")(h)
    return keras.Model(x, _head(h))


def test_separable_conv_reads_its_input_group_and_creates_one():
    model = _separable_stub()
    prof = kp.profile(model)
    rows = _rows(prof)
    assert rows["sep"].in_variables == ["c"] and rows["sep"].out_variables == ["sep"]
    assert rows["sep"].params == 9 * 6 * 2 + 12 * 5 + 5
    _assert_unchanged(prof, model)
    _assert_costs_match(prof, {"c": 4, "sep": 3}, _separable_stub(c=4, sep=3))


def _transpose_stub(c=6, up=5):
    x = keras.Input((4, 4, 3), name="img")
    h = L.Conv2D(c, 3, padding="same", name="c")(x)
    h = L.Conv2DTranspose(up, 3, strides=2, padding="same", name="up")(h)
    h = L.Conv2D(4, 3, name="post")(h)
    return keras.Model(x, _head(h))


def test_conv_transpose_reads_its_input_group_and_creates_one():
    model = _transpose_stub()
    prof = kp.profile(model)
    rows = _rows(prof)
    assert rows["up"].in_variables == ["c"] and rows["up"].out_variables == ["up"]
    assert rows["post"].in_variables == ["up"]
    _assert_unchanged(prof, model)
    _assert_costs_match(prof, {"c": 3, "up": 2}, _transpose_stub(c=3, up=2))


def _conv1d_stub(c1=8, c2=4):
    x = keras.Input((16, 3), name="img")
    h = L.Conv1D(c1, 3, name="c1")(x)
    h = L.BatchNormalization(name="bn")(h)
    h = L.Conv1D(c2, 3, strides=2, name="c2")(h)
    h = L.GlobalAveragePooling1D(name="gap")(h)
    return keras.Model(x, L.Dense(3, name="head")(h))


def test_conv1d_chain():
    model = _conv1d_stub()
    prof = kp.profile(model)
    rows = _rows(prof)
    assert rows["bn"].in_variables == rows["c2"].in_variables == ["c1"]
    assert rows["head"].in_variables == ["c2"]
    _assert_unchanged(prof, model)
    _assert_costs_match(prof, {"c1": 5, "c2": 2}, _conv1d_stub(c1=5, c2=2))


# ---------------------------------------------------------------------------
# Element-wise gates and keras.ops.


def _se_stub(feat=16, reduce=4, proj=8):
    x = keras.Input((8, 8, 3), name="img")
    f = L.ReLU(name="relu")(L.Conv2D(feat, 3, padding="same", name="feat")(x))
    g = L.GlobalAveragePooling2D(name="squeeze")(f)
    g = L.Reshape((1, 1, feat), name="rs")(g)
    g = L.Conv2D(reduce, 1, activation="relu", name="reduce")(g)
    g = L.Conv2D(feat, 1, activation="sigmoid", name="expand")(g)
    y = L.Multiply(name="excite")([f, g])
    return keras.Model(x, _head(L.Conv2D(proj, 1, name="proj")(y)))


def test_squeeze_excite_gate_is_tied_to_the_features():
    model = _se_stub()
    prof = kp.profile(model)
    rows = _rows(prof)
    assert rows["reduce"].in_variables == ["feat"] and rows["reduce"].out_variables == ["reduce"]
    assert rows["expand"].in_variables == ["reduce"] and rows["expand"].out_variables == ["feat"]
    assert rows["excite"].in_variables == ["feat", "feat"]
    assert rows["excite"].out_variables == rows["proj"].in_variables == ["feat"]
    assert {g.name for g in prof.variables} == {IMG, "feat", "reduce", "proj", "head"}
    _assert_unchanged(prof, model)
    _assert_costs_match(prof, {"feat": 10, "reduce": 3, "proj": 5},
                        _se_stub(feat=10, reduce=3, proj=5))


def _spatial_gate_stub(f=8):
    x = keras.Input((8, 8, 3), name="img")
    feat = L.Conv2D(f, 3, padding="same", name="f")(x)
    gate = L.Conv2D(1, 1, activation="sigmoid", name="g")(feat)
    y = L.Multiply(name="mul")([gate, feat])
    return keras.Model(x, _head(L.Conv2D(4, 1, name="c")(y)))


def test_one_channel_gate_broadcasts_without_coupling():
    model = _spatial_gate_stub()
    prof = kp.profile(model)
    rows = _rows(prof)
    assert rows["g"].out_variables == ["g"] and _variable(prof, "g")[1].width == 1
    assert rows["mul"].out_variables == rows["c"].in_variables == ["f"]
    _assert_costs_match(prof, {"f": 5}, _spatial_gate_stub(f=5))


def _ops_stub(c1=8):
    x = keras.Input((8, 8, 3), name="img")
    h = L.Conv2D(c1, 3, padding="same", name="c1")(x)
    h = ops.relu(h * 0.5)
    h = ops.add(h, ops.sigmoid(h))
    h = L.Conv2D(4, 3, padding="same", name="c2")(h)
    return keras.Model(x, _head(h))


def test_keras_ops_in_a_functional_model_tie_channels():
    model = _ops_stub()
    prof = kp.profile(model)
    rows = _rows(prof)
    assert rows["c2"].in_variables == ["c1"]
    op_rows = [row for row in prof.layers if row.name not in ("c1", "c2", "gap", "head")]
    assert len(op_rows) == 4  # multiply, relu, sigmoid, add
    for row in op_rows:
        assert row.out_variables == ["c1"] and row.params == row.macs == 0
    assert {g.name for g in prof.variables} == {IMG, "c1", "c2", "head"}
    _assert_unchanged(prof, model)
    _assert_costs_match(prof, {"c1": 5}, _ops_stub(c1=5))


def _merge_stub(merge_class, c=6):
    x = keras.Input((8, 8, 3), name="img")
    a = L.Conv2D(c, 3, padding="same", name="a")(x)
    b = L.Conv2D(c, 1, name="b")(x)
    y = merge_class(name="merge")([a, b])
    return keras.Model(x, _head(L.Conv2D(4, 1, name="c")(y)))


@pytest.mark.parametrize("merge_class", [L.Subtract, L.Multiply, L.Average, L.Maximum, L.Minimum])
def test_elementwise_merges_tie_their_inputs(merge_class):
    model = _merge_stub(merge_class)
    for residual in ("prefix", "tie"):
        prof = kp.profile(model, residual=residual)
        rows = _rows(prof)
        assert rows["b"].out_variables == rows["merge"].out_variables == rows["c"].in_variables == ["a"]
        assert {g.name for g in prof.variables} == {IMG, "a", "c", "head"}
        assert _variable(prof, "a")[1].kind == "channels"
        _assert_costs_match(prof, {"a": 4}, _merge_stub(merge_class, c=4))


def _shape_only_stub(c=6):
    """Layers that move pixels but never mix channels."""
    x = keras.Input((8, 8, 3), name="img")
    h = L.Conv2D(c, 3, padding="same", name="conv")(x)
    for layer in (L.ZeroPadding2D(1), L.Cropping2D(1), L.UpSampling2D(2),
                  L.MaxPooling2D(2), L.AveragePooling2D(2), L.Dropout(0.1),
                  L.SpatialDropout2D(0.1), L.Activation("relu"), L.LeakyReLU(),
                  L.Rescaling(0.5), L.Identity(), L.Reshape((16, c))):
        h = layer(h)
    return keras.Model(x, L.Conv1D(4, 3, name="post")(h))


def test_shape_only_layers_keep_the_channel_group():
    model = _shape_only_stub()
    prof = kp.profile(model)
    for row in prof.layers:
        if row.name not in ("conv", "post"):
            assert row.in_variables == row.out_variables == ["conv"], row.name
    assert _rows(prof)["post"].in_variables == ["conv"]
    _assert_unchanged(prof, model)
    _assert_costs_match(prof, {"conv": 3}, _shape_only_stub(c=3))


# ---------------------------------------------------------------------------
# Model structure: nesting, sharing, flattening.


def _nested_stub(conv=8, conv2=4):
    i = keras.Input((8, 8, 3), name="inner_in")
    h = L.BatchNormalization(name="bn")(L.Conv2D(conv, 3, padding="same", name="conv")(i))
    inner = keras.Model(i, h, name="inner")
    seq = keras.Sequential(
        [keras.Input((8, 8, conv)), L.Conv2D(conv2, 1, name="conv"), L.ReLU(name="relu")],
        name="seq")
    x = keras.Input((8, 8, 3), name="img")
    return keras.Model(x, _head(seq(inner(x))))


def test_nested_models_are_flattened_with_prefixed_names():
    model = _nested_stub()
    prof = kp.profile(model)
    rows = _rows(prof)
    assert list(rows) == ["inner/conv", "inner/bn", "seq/conv", "seq/relu", "gap", "head"]
    assert rows["inner/conv"].in_variables == [IMG]
    assert rows["inner/bn"].out_variables == rows["seq/conv"].in_variables == ["inner/conv"]
    assert rows["head"].in_variables == ["seq/conv"]
    assert {g.name for g in prof.variables} == {IMG, "inner/conv", "seq/conv", "head"}
    _assert_unchanged(prof, model)
    _assert_costs_match(prof, {"inner/conv": 5, "seq/conv": 3}, _nested_stub(conv=5, conv2=3))


def _flatten_stub(c=5):
    x = keras.Input((4, 4, 3), name="img")
    h = L.Flatten(name="flat")(L.Conv2D(c, 3, padding="same", name="conv")(x))
    return keras.Model(x, L.Dense(7, name="fc")(h))


def test_flatten_into_dense_counts_spatial_times_channels():
    model = _flatten_stub()
    prof = kp.profile(model)
    rows = _rows(prof)
    assert rows["fc"].in_variables == ["conv"] and rows["flat"].out_variables == ["conv"]
    assert rows["fc"].params == 16 * 5 * 7 + 7
    _assert_unchanged(prof, model)
    _assert_costs_match(prof, {"conv": 2}, _flatten_stub(c=2))


def _two_resolution_stub(c=6):
    """One conv shared by two inputs of different spatial size."""
    x1 = keras.Input((8, 8, 3), name="big")
    x2 = keras.Input((4, 4, 3), name="small")
    shared = L.Conv2D(c, 3, padding="same", name="shared")
    a = L.GlobalAveragePooling2D(name="gap1")(shared(x1))
    b = L.GlobalAveragePooling2D(name="gap2")(shared(x2))
    y = L.Concatenate(name="cat")([a, b])
    return keras.Model([x1, x2], L.Dense(3, name="head")(y))


def test_shared_layer_counts_params_once_and_macs_per_call():
    model = _two_resolution_stub()
    prof = kp.profile(model)
    rows = _rows(prof)
    assert rows["shared"].params == 27 * 6 + 6
    assert rows["shared"].macs == (64 + 16) * 27 * 6
    assert rows["head"].in_variables == ["shared", "shared"]
    _assert_unchanged(prof, model)
    _assert_costs_match(prof, {"shared": 4}, _two_resolution_stub(c=4))


def _recurrent_stub(c=6):
    """A shared conv applied to its own output: its input and output tie."""
    x = keras.Input((8, 8, 3), name="img")
    h = L.Conv2D(c, 3, padding="same", name="pre")(x)
    shared = L.Conv2D(c, 3, padding="same", name="shared")
    return keras.Model(x, _head(shared(shared(h))))


def test_shared_layer_ties_the_inputs_of_its_calls():
    model = _recurrent_stub()
    prof = kp.profile(model)
    rows = _rows(prof)
    assert rows["shared"].in_variables == rows["shared"].out_variables == ["pre"]
    assert {g.name for g in prof.variables} == {IMG, "pre", "head"}
    _assert_unchanged(prof, model)
    _assert_costs_match(prof, {"pre": 4}, _recurrent_stub(c=4))


def test_shared_add_writing_into_two_streams_rebuilds_as_one_prefix_add():
    """keras_hub's feature pyramid merges every level with one ``Add``; pruned, each call adds
    a narrower input into a stream, and the rebuild keeps one (prefix) add for both calls."""
    x = keras.Input((8, 8, 3), name="img")
    merge = L.Add(name="merge")
    stream = L.Conv2D(8, 3, padding="same", name="stream")(x)
    h = merge([stream, L.Conv2D(8, 3, padding="same", name="c1")(stream)])
    h = merge([h, L.Conv2D(8, 3, padding="same", name="c2")(h)])
    model = keras.Model(x, _head(h))
    new = kp.precrop(model, params=0.5)
    assert_matches_plan(model, new.precrop_plan, new)
    assert [type(layer).__name__ for layer in new.layers if layer.name == "merge"] == ["PrefixAdd"]


# ---------------------------------------------------------------------------
# Normalization.


def _layer_norm_stub(c=6, axis=-1):
    x = keras.Input((8, 8, 3), name="img")
    h = L.Conv2D(c, 3, padding="same", name="c")(x)
    h = L.LayerNormalization(axis=axis, name="ln")(h)
    return keras.Model(x, _head(L.Conv2D(4, 1, name="c2")(h)))


@pytest.mark.parametrize("axis", [-1, (1, 2, 3)])
def test_layer_normalization_ties_and_scales_with_width(axis):
    model = _layer_norm_stub(axis=axis)
    prof = kp.profile(model)
    rows = _rows(prof)
    assert rows["ln"].in_variables == rows["ln"].out_variables == rows["c2"].in_variables == ["c"]
    _assert_unchanged(prof, model)
    _assert_costs_match(prof, {"c": 3}, _layer_norm_stub(c=3, axis=axis))


def _time_norm_stub(c=8):
    """LayerNorm over the *time* axis of 8 steps: its 2 x 8 weights never change."""
    x = keras.Input((8, 3), name="img")
    h = L.Conv1D(c, 1, name="c")(x)
    h = L.LayerNormalization(axis=1, name="ln")(h)
    return keras.Model(x, L.Conv1D(4, 1, name="c2")(h))


def test_normalization_over_a_non_channel_axis_stays_constant():
    """Library bug: the tie handler takes any weight whose last dimension
    equals the channel count as per-channel, so when the time axis happens to
    be as long as the channel axis (8 and 8) its LayerNorm weights are scaled
    with the width, a silently wrong cost at any other width."""
    prof = kp.profile(_time_norm_stub())
    assert _rows(prof)["ln"].params == 16
    _assert_costs_match(prof, {"c": 5}, _time_norm_stub(c=5))


# ---------------------------------------------------------------------------
# ignore=.


def _plain_chain(c2=8):
    x = keras.Input((8, 8, 3), name="img")
    h = L.Conv2D(8, 3, padding="same", name="c0")(x)
    h = L.Conv2D(8, 3, padding="same", name="c1")(h)
    h = L.Conv2D(c2, 3, padding="same", name="c2")(h)
    return keras.Model(x, _head(h))


def test_ignore_keeps_a_layers_groups_fixed():
    model = _plain_chain()
    free = kp.profile(model)
    assert all(row.prunable for row in free.layers if row.params)
    assert not any(g.fixed for g in free.variables if g.name in ("c0", "c1", "c2"))
    prof = kp.profile(model, ignore=["c1"])
    rows = _rows(prof)
    assert rows["c1"].in_variables == ["c0"] and rows["c1"].out_variables == ["c1"]
    assert _variable(prof, "c0")[1].fixed and _variable(prof, "c1")[1].fixed
    assert not _variable(prof, "c2")[1].fixed
    assert not rows["c0"].prunable and not rows["c1"].prunable and rows["c2"].prunable
    _assert_unchanged(prof, model)
    _assert_costs_match(prof, {"c2": 3}, _plain_chain(c2=3))
