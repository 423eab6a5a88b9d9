"""keras_hub task models: prune the backbone, keep the task.

A ``keras_hub`` task (``ResNetImageClassifier``, ``DeepLabV3ImageSegmenter``,
``RetinaNetObjectDetector``, ``BASNetImageSegmenter``, ...) is its
``backbone`` plus a head that the task class builds from its own config, and
what makes it a task lives outside the graph: ``compile()`` defaults, the
loss (RetinaNet encodes boxes onto anchors in ``compute_loss``, BASNet sums a
loss over every output of its backbone), the preprocessor, box decoding in
``predict``. Pruning the task's functional graph as a whole would return a
plain ``keras.Model`` without any of that, and the task class could not take
it back: its head is built from its config (RetinaNet's prediction heads
have 256 filters, written in its constructor).

So the functions here prune the **backbone** (for DeepLabV3 that includes
the atrous spatial pyramid pooling and decoder, for RetinaNet the feature
pyramid, for BASNet the prediction and refinement modules: everything of the
task but its last layers) and re-create the task from its config around the
rebuilt backbone, a :class:`PrunedBackbone`. The budgets are ratios of the
backbone's parameters and MACs; the backbone's output widths stay as they
are, so the head the task class builds fits them, and keeps its widths.
With ``weights="keep"`` the head keeps its trained weights too: the
backbone's outputs keep every channel in its original order (a model's
outputs are fixed), so the head's weights are carried over whole.

Nothing here imports ``keras_hub``: the task's own class re-creates it.
"""

from __future__ import annotations

import json

import keras

from keras_precrop import gradual, planning
from keras_precrop.errors import (
    ArgumentError,
    InfeasibleBudgetError,
    PlanMismatchError,
    UnsupportedModelError,
)
from keras_precrop.graph.attention import ATTENTION
from keras_precrop.graph.replay import topological_nodes
from keras_precrop.hub_configs import CONFIG_WIDTHS, config_widths, table_key
from keras_precrop.plans import plan_argument
from keras_precrop.subject import Subject
from keras_precrop.training import gradients as _gradients
from keras_precrop.training._user_data import check_data
from keras_precrop.transfer.criteria import criterion
from keras_precrop.transfer.refit import refit_head

# plan.solver's key for the config a homogeneous plan re-creates the model from ({key: width}).
_CONFIG = "hub_config"
# PrunedBackbone's attribute: the key of CONFIG_WIDTHS its widths are read by (re-pruned too).
_TABLE = "_config_widths"


@keras.saving.register_keras_serializable(package="keras_precrop")
class PrunedBackbone(keras.Model):
    """A rebuilt backbone: a functional model with the attributes tasks read.

    A ``keras_hub`` ``Backbone`` saves the arguments of its constructor, which
    describe the original widths, so a pruned one is a functional model. Task
    classes read attributes of their backbone (RetinaNet: ``image_shape``,
    ``min_level``, ``max_level``; HGNetV2's classifier: ``stage_names`` and
    ``hidden_sizes[-1]``, the output width, which pruning keeps;
    MobileNetV5's: ``use_msfa``, ``norm_layer``, ``act_layer``), so this
    model keeps every attribute the backbone's class added with a plain value
    (numbers, strings, lists of them), through ``.keras`` save and load too.

    The widths :data:`~keras_precrop.hub_configs.CONFIG_WIDTHS` names for the
    backbone's class (a ViT's ``hidden_dim``, ``num_heads``, ``mlp_dim``) say
    the pruned backbone: the width of every block where the blocks agree;
    where they differ the attribute is left out (reading it raises
    ``AttributeError``) rather than state one wrong number, and
    ``precrop_plan.summary()`` gives each block's. Other widths (a ResNet's
    ``stackwise_num_filters``) describe the original backbone, except the
    output widths, which pruning keeps; the graph is what the pruned one
    computes.

    Args:
        *args: ``inputs`` and ``outputs``, as for a functional ``keras.Model``.
        attributes: ``{name: value}`` set on the model and saved with it.
        **kwargs: further ``keras.Model`` arguments (``name``).
    """

    def __init__(self, *args, attributes=None, **kwargs):
        super().__init__(*args, **kwargs)
        self._attributes = dict(attributes or {})
        for key, value in self._attributes.items():
            if not hasattr(type(self), key):  # EfficientNet's input_shape is the model's own
                setattr(self, key, value)

    def get_config(self):
        return {**super().get_config(), "attributes": dict(self._attributes)}


def precrop(model, params=None, flops=None, *, homogeneous=None, **options):
    """:func:`keras_precrop.precrop` of a keras_hub task's backbone; the task rebuilt around it.

    Args:
        model: a keras_hub task (a model with a ``backbone``), or a backbone.
        params: parameter budget as a ratio of the backbone's parameters
            (with ``homogeneous=True``: of the task's, head included).
        flops: MAC budget as a ratio of the backbone's MACs (likewise).
        homogeneous: ``True``: the same widths in every block, which the
            backbone's own config can say (``hub_configs.CONFIG_WIDTHS``:
            keras_hub's ``ViTBackbone``, ``DeiTBackbone`` and ``BertBackbone``),
            so the result is a task of the same classes built from a new
            config (``hidden_dim``, ``num_heads``, ``mlp_dim``); it saves and
            loads with keras_hub alone, and the head is re-created on the
            new hidden width. A ViT (and BERT) keeps its head size, so its
            heads and hidden width shrink together. ``False``:
            per-block widths, the backbone a functional
            :class:`PrunedBackbone` whose output width (the head's input) is
            kept. ``None``: ``True`` for a task of a backbone in that table.
        **options: as for :func:`keras_precrop.precrop` (``mode``,
            ``round_to``, ``ignore``: names of the backbone's layers (as the
            backbone or the task's plan names them), or ``"auto"`` to keep
            whole what the walk refuses, ...).
            With ``weights="keep"`` the backbone's surviving channels and
            the task's head keep their trained weights (``importance``: a
            ranking of the table; per block one that reads no loss, e.g.
            ``"l1"``, ``"l2"``, ``"bn_scale"``, ``"random"`` or
            ``"activation"`` (on ``data=``: batches of inputs, labels
            unread), as a backbone's outputs are features; a homogeneous
            plan ranks the whole task, whose logits ``"taylor"`` takes with
            ``data=`` too). ``refit=True`` refits, per block, the
            backbone's projections to the original backbone's features,
            then the head's to the task's outputs from the pruned features
            (a CNN's convolutions keep their weights: its head is what a
            refit moves); under a homogeneous plan, every projection of the
            task, head included, to its outputs.

    Returns:
        A new task of ``model``'s class and config (compiled with the task's
        defaults, as its constructor does), whose ``backbone`` is a
        :class:`PrunedBackbone` (or, homogeneous, of the backbone's class);
        or, for a backbone, the :class:`PrunedBackbone`. Its
        ``.precrop_plan`` is the plan (of the backbone; homogeneous: of the task),
        which :func:`apply_plan` replays into the same model.
    """
    options.setdefault("upper", 1.0)
    return _pruned(planning.precrop, model, params, flops, homogeneous, options)


def reconfigure(model, params=None, flops=None, *, homogeneous=None, **options):
    """:func:`keras_precrop.reconfigure` of a task's backbone (layers may widen); see :func:`precrop`."""
    options.setdefault("upper", None)
    return _pruned(planning.reconfigure, model, params, flops, homogeneous, options)


def plan(model, params=None, flops=None, *, homogeneous=None, **options):
    """The plan :func:`precrop` would build ``model`` with, without building it.

    A homogeneous plan (the default for a task whose backbone's config can
    say its widths) is a plan of the whole task, for :class:`GradualPruning`
    or :func:`apply_plan`; a per-block one is a plan of the backbone
    (``kp.plan(backbone_of(model), ...)``).

    Args:
        model: a keras_hub task, or a backbone.
        params: as for :func:`precrop`.
        flops: as for :func:`precrop`.
        homogeneous: as for :func:`precrop`.
        **options: as for :func:`keras_precrop.plan` (``mode``, ``ignore``, ...).

    Returns:
        A :class:`~keras_precrop.Plan`.
    """
    widths, options = _prepared("hub.plan", model, homogeneous, options)
    if widths is None:
        return planning.plan(backbone_of(model), params, flops, **options)
    return _homogeneous_plan(model, params, flops, widths, options)[1]


def _pruned(method, model, params, flops, homogeneous, options):
    """``method`` (PreCrop or PreConfig) of ``model``'s backbone, the task rebuilt around it."""
    widths, options = _prepared(f"hub.{method.__name__}", model, homogeneous, options,
                                planning.precrop)
    if widths is not None:
        return _homogeneous(model, params, flops, widths, options)
    options, head_data = _calibration(model, options)
    new = method(backbone_of(model), params, flops, **options)
    return _rewrapped(model, new, options.get("weights"), head_data, options.get("verbose", 1))


def _prepared(caller, model, homogeneous, options, via=None):
    """``(config widths or None, options)``: the first steps :func:`plan` and :func:`precrop`
    share. Checks the option names (of ``caller``, as ``via`` takes them), the ranking and what a
    homogeneous plan refuses; ``ignore=`` named as the walk names the layers."""
    planning.check_option_names(caller, options, via)
    widths = _config_widths(model, homogeneous)
    _check_importance(options.get("importance"), model, widths is not None)
    if widths is not None:
        _refuse_seed(options.get("seed"))
        _refuse_head_dims(options.get("attention", "heads"))
    return widths, _named_for_walk(model, options, widths is not None)


def _named_for_walk(model, options, whole):
    """``options`` with ``ignore=``'s names as the walk names them: the backbone's layers by
    their own names per block, by the task's path (the backbone's name, ``_``, theirs) when a
    homogeneous plan walks the whole task; either spelling is taken."""
    backbone, ignore = backbone_of(model), options.get("ignore")
    if backbone is model or not ignore:
        return options
    ignore = [ignore] if isinstance(ignore, str) else ignore  # one string is one name
    prefix, own = f"{backbone.name}_", {layer.name for layer in model.layers}
    if whole:
        names = [n if n == "auto" or n in own or n.startswith(prefix) else prefix + n for n in ignore]
    else:
        names = [n.removeprefix(prefix) for n in ignore]
    return {**options, "ignore": names}


def _config_widths(model, homogeneous):
    """The backbone's :class:`~keras_precrop.hub_configs.ConfigWidths` if the plan is homogeneous."""
    if homogeneous not in (None, True, False):
        raise ArgumentError("{homogeneous} must be True, False or None.", homogeneous=homogeneous)
    backbone = backbone_of(model)
    widths = config_widths(backbone)
    if homogeneous and widths is None:
        raise ArgumentError(
            f"{{homogeneous}}: the config of {type(backbone).__name__} cannot say a pruned model's "
            f"widths (the backbones whose can: {sorted(n.rsplit('.', 1)[-1] for n in CONFIG_WIDTHS)});"
            " use {homogeneous:False}.", homogeneous=homogeneous)
    if homogeneous is False or widths is None or (homogeneous is None and backbone is model):
        return None
    return widths


def _homogeneous(model, params, flops, widths, options):
    """The task planned with the same widths in every block and re-created from a new config."""
    applied = {key: options.pop(key) for key in ("weights", "importance", "data", "seed", "refit",
                                                 "verbose") if key in options}
    options = planning.with_latency_verbose(options, applied.get("verbose", 1))
    subject, the_plan = _homogeneous_plan(model, params, flops, widths, options)
    return _configured(subject, the_plan, widths, applied)


def _homogeneous_plan(model, params, flops, widths, options):
    """The task's plan with the same widths in every block, and the :class:`Subject` walked for it
    (one walk for the tie, the plan, the check and the weights); the plan records the config
    it re-creates the task from, which :func:`apply_plan` and :class:`GradualPruning` read."""
    options = {"residual": widths.residual, **options}
    subject = Subject(model)
    # The walker refuses a value of attention it does not know (a typo), before it walks.
    graph = subject.profile(options.get("ignore", ()), options["residual"], {},
                            options.get("attention", "heads")).graph
    try:
        the_plan = planning.plan(subject, params, flops, tie=widths.tie(graph.variables), **options)
    except InfeasibleBudgetError as err:
        raise _held_whole(err, widths.held(graph.variables)) from None
    the_plan.solver[_CONFIG] = widths.config(graph.variables, the_plan.widths)
    return subject, the_plan


def _held_whole(err, held):
    """``err`` (a budget no widths meet), saying which config keys one fixed layer kept whole in
    every block (see :meth:`~keras_precrop.hub_configs.ConfigWidths.held`)."""
    if not held:
        return err
    why = "; ".join(f"{key}, as {name!r} is fixed" for key, name in held.items())
    return InfeasibleBudgetError(
        err.template + " With the same widths in every block, one layer kept whole (ignored, or "
        f"the model's output) keeps its config key whole in every block: {why}. Use "
        "{homogeneous:False} to keep only that layer whole.", limit=err.limit, remedy=err.remedy,
        **err.arguments)


def _configured(subject, plan, widths, applied):
    """The subject's model with ``plan``'s widths, re-created from a config of its classes."""
    new = planning.apply_with(subject, plan, _config_builder(subject.model, widths), **applied)
    new.precrop_plan = plan
    return new


def _config_builder(model, widths):
    """``build(graph, new_widths, seed=None)``: ``model`` re-created from a config that says the
    graph's new widths (``widths``: the backbone's
    :class:`~keras_precrop.hub_configs.ConfigWidths`); the seed is refused before (see
    :func:`_refuse_seed`)."""

    def build(graph, new_widths, seed=None):
        named = {v.name: w for v, w in zip(graph.variables, new_widths)}
        values = widths.config(graph.variables, named)
        task = {key: values.pop(key) for key in widths.task_keys if key in values}
        return _from_config(model, values, task)

    return build


def _refuse_seed(seed):
    """A model made from its config draws its weights from Keras' global random state."""
    if seed is not None:
        raise ArgumentError(
            "{seed} cannot seed a keras_hub model made from its config (the same widths in every "
            "block); {remedy}.", seed=seed, remedy={
                "python": "call keras.utils.set_random_seed first, or use per-block widths "
                          "(homogeneous=False, and its plan)",
                "cli": "leave --seed out, or prune per block (--no-homogeneous)"})


def _refuse_head_dims(attention):
    """Refuse narrower heads in a model made from its config; a value the walker does not know
    (a typo) is left to the walker's own check, which names the values it takes."""
    if attention in ATTENTION and attention != "heads":
        raise ArgumentError(
            "{attention} narrows each head, and a keras_hub transformer's config derives the head "
            "size from hidden_dim / num_heads, so the same class cannot say it; pass "
            "{homogeneous:False} for per-block widths with narrower heads.", attention=attention)


def _from_config(model, values, task=None):
    """``model`` (a task or a backbone) re-created with its backbone's config keys set to
    ``values`` (and the task's to ``task``)."""
    backbone = backbone_of(model)
    new_backbone = type(backbone).from_config({**backbone.get_config(), **values})
    new = new_backbone if backbone is model else type(model).from_config(
        {**model.get_config(), **(task or {}), "backbone": new_backbone,
         "preprocessor": model.preprocessor})
    for old_fn, new_fn in ((model, new), (backbone, new_backbone)):
        _same_op_names(old_fn, new_fn)
    return new


def _same_op_names(old, new):
    """Give the ``keras.ops`` operations of ``new``'s graph the names of ``old``'s.

    The same config builds the same graph, but an operation (a task's
    ``x[:, 0]``) is named by a global counter; the plan names it as the
    original model does, and the check of the new model against the plan
    compares by name.
    """
    for a, b in zip(topological_nodes(old), topological_nodes(new), strict=True):
        if not isinstance(a.operation, keras.layers.Layer) and type(a.operation) is type(b.operation):
            b.operation.name = a.operation.name


def apply_plan(model, plan, weights=None, importance=None, data=None, seed=None, refit=False,
               verbose=1):
    """The task (or backbone) with the widths of ``plan``: what :func:`precrop` made it with.

    ``plan`` is a :class:`~keras_precrop.Plan` or a plan file's path (the
    result's ``.precrop_plan`` is a plan either way). A plan of the backbone
    (``homogeneous=False``, or ``kp.plan(backbone_of(task), ...)``) gives a
    :class:`PrunedBackbone`; a homogeneous plan (of the task, for a backbone
    in ``hub_configs.CONFIG_WIDTHS``) re-creates the task from a new config,
    as :func:`precrop` did. ``weights``, ``importance``, ``data``, ``seed``
    ``refit`` and ``verbose`` are as for :func:`keras_precrop.apply_plan` (see :func:`precrop`).
    """
    plan = plan_argument(plan)
    whole = configures(plan) or _of_task(model, plan)  # a plan of the task, re-created from a config
    _check_importance(importance, model, whole)
    if whole:
        widths = _task_config_widths(model, plan)
        _refuse_seed(seed)
        _refuse_head_dims(plan.attention)
        return _configured(Subject(model), plan, widths,
                           {"weights": weights, "importance": importance, "data": data,
                            "refit": refit, "verbose": verbose})
    options, head_data = _calibration(model, {"data": data, "refit": refit})
    new = planning.apply_plan(backbone_of(model), plan, weights, importance, options["data"], seed,
                              refit, verbose)
    new.precrop_plan = plan
    return _rewrapped(model, new, weights, head_data, verbose)


class GradualPruning(gradual.GradualPruning):
    """:class:`keras_precrop.GradualPruning` of a keras_hub task, whose smaller model is of the
    task's own classes, as :func:`precrop` makes it.

    The plan is one of :func:`plan`: under a homogeneous plan (of a ViT,
    DeiT or BERT task) :meth:`finalize` re-creates the task from a new config
    (``hidden_dim``, ``num_heads``, ``mlp_dim``), which saves and loads with
    keras_hub alone; under a per-block plan (of the task's backbone) the
    fit prunes the backbone and :meth:`finalize` gives the task around a
    :class:`PrunedBackbone`, its head's trained weights kept (the backbone's
    output widths are). Either way the channels the masks kept keep their
    trained weights, and the result computes what the masked task computed
    at the end of the fit. Everything else is as for
    :class:`keras_precrop.GradualPruning`, whose arguments it takes; after
    :meth:`finalize` under a per-block plan,
    :meth:`~keras_precrop.GradualPruning.carry_optimizer` carries the
    backbone's optimizer state (the head's starts anew).

    Raises:
        ArgumentError: when the first fit begins, a per-block plan of the
            whole task (``kp.plan(task)``: its model is functional; prune it
            with :class:`keras_precrop.GradualPruning`).
    """

    def __init__(self, plan, end_step, **options):
        super().__init__(plan, end_step, **options)
        self._task = None

    def on_train_begin(self, logs=None):
        """At the first fit, bind to the task (and to its backbone under a per-block plan); then as
        for :class:`keras_precrop.GradualPruning`."""
        if self._task is None:
            self._task = self._task_pruned()
            if configures(self.plan):
                if self._target is not None:  # model=task.backbone: a homogeneous plan is the task's
                    self._target = self._task
            elif _of_task(self._task, self.plan):
                raise ArgumentError(
                    f"kp.hub.GradualPruning: the plan of {self.plan.model_name!r} prunes the "
                    "task's whole graph per block, whose model cannot be of its classes; plan "
                    "with kp.hub.plan(task, ...), or prune it into a functional model with "
                    "kp.GradualPruning.")
            else:
                self._target = backbone_of(self._task)
        super().on_train_begin(logs)

    def _task_pruned(self):
        """The task whose classes the result takes: the model pruned, or the fitted task (or
        Distiller's student) whose backbone ``model=`` names."""
        fitted = getattr(self.model, "student", self.model)
        if self._target is not None and backbone_of(fitted) is self.pruned:
            return fitted
        return self.pruned

    def finalize(self):
        """The smaller task of the plan (see the class); as :meth:`keras_precrop.GradualPruning.finalize`."""
        new = super().finalize()
        return new if configures(self.plan) else _rewrapped(self._task, new, weights="keep")

    def _build(self, graph, widths, seed=None):
        if not configures(self.plan):
            return super()._build(graph, widths, seed)
        return _config_builder(self._task, _task_config_widths(self._task, self._plan))(graph, widths)


def configures(plan):
    """Whether ``plan`` is a homogeneous plan, which says a config of the task's own classes:
    :func:`apply_plan` and :class:`GradualPruning` re-create the task from it."""
    return _CONFIG in plan.solver


def _of_task(model, plan):
    """Whether ``plan`` was made for the task ``model`` (as a whole) rather than its backbone."""
    backbone = backbone_of(model)
    return backbone is not model and plan.model_name == model.name != backbone.name


def _task_config_widths(model, plan):
    """The :class:`~keras_precrop.hub_configs.ConfigWidths` that re-create ``model`` for a plan
    of the whole task; refused for a backbone whose config cannot say its widths."""
    backbone = backbone_of(model)
    widths = config_widths(backbone)
    if widths is None:
        raise PlanMismatchError(
            f"Plan for {plan.model_name!r} is a plan of the whole task, and the config of "
            f"{type(backbone).__name__} cannot say its widths; pass kp.hub.apply_plan a plan of the "
            f"backbone {backbone.name!r}: kp.hub.precrop(task, homogeneous=False).precrop_plan or "
            "kp.plan(kp.hub.backbone_of(task), ...).")
    return widths


def backbone_of(model):
    """``model.backbone`` for a task, ``model`` itself otherwise."""
    backbone = getattr(model, "backbone", None)
    return backbone if isinstance(backbone, keras.Model) else model


def _attributes(backbone, new, plan):
    """What ``backbone``'s class adds to a functional model (``new``), with plain values, its
    widths as ``plan`` gives them (see :func:`_planned_widths`).

    A JSON round trip turns tuples into lists, as a ``.keras`` file does, so
    the attributes read the same before and after a save.
    """
    if isinstance(backbone, PrunedBackbone):
        return _planned_widths(dict(backbone._attributes), plan)
    own = set(vars(backbone)) - set(vars(new))
    attributes = {key: json.loads(json.dumps(value)) for key, value in vars(backbone).items()
                  if key in own and not key.startswith("_") and _plain(value)}
    table = table_key(backbone)
    if table is not None:
        attributes[_TABLE] = table
    return _planned_widths(attributes, plan)


def _planned_widths(attributes, plan):
    """``attributes`` with the widths the table names set to what ``plan`` gives every block.

    A key whose blocks ``plan`` gives several widths (per-block widths) is
    left out: no one number says it, and the original's would be wrong.
    """
    table = CONFIG_WIDTHS.get(attributes.get(_TABLE))
    if table is None:
        return attributes
    out = dict(attributes)
    for key, widths in table.planned(plan.variables).items():  # a re-pruned one may agree again
        if len(widths) == 1:
            out[key] = int(next(iter(widths)))
        elif widths:
            out.pop(key, None)
    return out


def _plain(value):
    if isinstance(value, (list, tuple)):
        return all(_plain(v) for v in value)
    return value is None or isinstance(value, (bool, int, float, str))


def _check_importance(importance, model, whole):
    """Refuse a ranking whose need kp.hub cannot meet (the table's ``PLACES``) where a backbone
    is ranked: one that differentiates a loss takes a model's outputs as logits, and a
    backbone's are features (activations serve). A task ranked ``whole`` (a homogeneous plan)
    has logits: any ranking goes."""
    if importance is not None and not (whole and backbone_of(model) is not model):
        criterion(importance, "kp.hub")


def _rewrapped(model, new, weights=None, head_data=None, verbose=1):
    """The rebuilt backbone ``new`` as a :class:`PrunedBackbone`, inside a new ``model`` task.

    With ``weights="keep"`` the task's own weights (its head) are carried too,
    and with ``head_data`` (a refit's batches of inputs) its projections are
    then refit to the task's outputs, from the pruned backbone's features.
    """
    backbone = backbone_of(model)
    attributes = _attributes(backbone, new, new.precrop_plan)
    pruned = PrunedBackbone(new.input, new.output, name=new.name, attributes=attributes)
    result = pruned
    if backbone is not model:
        config = {**model.get_config(), "backbone": pruned, "preprocessor": model.preprocessor}
        result = type(model).from_config(config)
        if weights is not None:
            _carry_head(model, result)
        if head_data is not None:
            refit_head(model, result, list(zip(_head_layers(model), _head_layers(result))),
                       head_data, verbose)
    result.precrop_plan = new.precrop_plan
    return result


def _calibration(model, options):
    """``(options, batches)``: a per-block refit of a task reads ``data=`` twice, for the
    backbone and then for the head, so its inputs are read once here into a list of batches
    (a generator's would be gone); ``batches`` is None where no head is refit."""
    if not options.get("refit") or options.get("data") is None or backbone_of(model) is model:
        return options, None
    checked = check_data(backbone_of(model), options["data"], "data", labels=False).data
    batches = [x for x, _ in _gradients.batches(checked, labels=False)]
    return {**options, "data": batches}, batches


def _head_layers(task):
    """The layers of ``task`` outside its backbone (its head), in the order Keras tracks them."""
    inside = {id(layer) for layer in task.backbone._flatten_layers(include_self=True)}
    return [layer for layer in task._flatten_layers(include_self=False) if id(layer) not in inside]


def _head_weights(task):
    """The weights of ``task`` outside its backbone (the head and any layer of the task's own)."""
    inside = {id(w) for w in task.backbone.weights}
    return [w for w in task.weights if id(w) not in inside]


def _carry_head(task, new):
    """Copy ``task``'s head weights into ``new``, the same task around its pruned backbone.

    The task class built both heads from one config, onto backbone outputs
    of the same widths in the same channel order, so they match weight for
    weight; a head that does not is refused rather than guessed.
    """
    old, fresh = _head_weights(task), _head_weights(new)
    if len(old) != len(fresh) or any(a.shape != b.shape for a, b in zip(old, fresh)):
        raise UnsupportedModelError(
            f"{type(task).__name__} {task.name!r}: weights='keep' cannot carry its head's weights "
            f"({[w.path for w in old][:6]}) into the task rebuilt around the pruned backbone, "
            "whose head has other weights; use weights=None.")
    for a, b in zip(old, fresh):
        b.assign(a)
