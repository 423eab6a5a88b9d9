"""Gradual structured pruning during ``model.fit``: channel masks that grow on a schedule.

A trained model pruned in one shot falls to chance and must climb back. Pruned
gradually (Zhu & Gupta 2017's schedule), it keeps learning while its channels
go a few at a time. :class:`GradualPruning` is a Keras callback, the shape
TFMOT's ``prune_low_magnitude`` + ``UpdatePruningStep`` gave Keras users, but
structured and ending in a really smaller model:

* every ``frequency`` optimizer steps between ``start_step`` and ``end_step``
  it ranks the channels of every width variable of a :class:`~keras_precrop.Plan`
  (``importance``: the weights' L1/L2 norm, first-order Taylor on a few
  batches of ``data``, or the BatchNormalization scales; re-ranked as
  training goes) and
  masks the lowest ones, as many as a cubic schedule says (from the original
  widths at ``start_step`` to the plan's at ``end_step``);
* a masked channel is zeroed in every weight that writes or reads it, the way
  the rebuild would cut it (kernels, biases, normalization scales, a reader's
  input rows, a residual stream's writers and readers' prefixes): the masks
  are computed by carrying an index array through the same code that carries
  kept weights into a rebuilt model (``transfer.carry``), so the masked model
  computes exactly what the rebuilt one will;
* a LayerNormalization or RMSNormalization whose channels are cut (a vision
  transformer's residual stream runs through one in every block) computes its
  statistics over the channels the masks keep, for the length of each fit: a
  masked channel is zero but would still count in its mean and variance. The
  layer is lent a call (its handler's ``masked_call``) that reads a 0/1
  variable of the kept channels, set at every update, and gets its own back
  when the fit ends, as the weights get their constraints. Its config, weights
  and graph never change: between fits, and after ``finalize``, the model
  computes as its layers do, which is no longer the pruned model (evaluate
  what ``finalize`` returns, or validate within the fit). Under JAX, or
  PyTorch with ``jit_compile``, whose compiled step would keep the values it
  was traced with, such a plan is refused before any step; so is a cut
  GroupNormalization or softmax over channels, on every backend;
* after each optimizer step the masks are applied again (``regrow=False``, the
  default: a masked channel stays at zero, and out: the channels an update
  kept, or a restored model's channels that are not zero, rank above the
  others at the next) or only at the next update
  (``regrow=True``: soft filter pruning, a masked channel may train back and
  win its place again). The optimizer's compiled update applies them, as a
  constraint lent to each weight for the length of the fit (the weights'
  own constraints apply first, and are given back when the fit ends), so
  between the updates a step needs nothing from the host; under JAX, whose
  compiled step cannot read a factor the host changes, the host applies
  them after each batch. At an update the step just trained has applied
  the factors until then, and the new masks complete them. (A fit that
  raises leaves the constraints lent, the masks in force, until the next
  fit with the callback or ``finalize``);
* optionally (``shrink``) the channels the plan's widths leave out, as ranked
  at the last update, fade towards zero before their masks come: their
  weights are multiplied by ``1 - shrink`` after every step, the proximal
  step of a weight-decay penalty on those channels alone (group sparsity
  aimed at what will go, as ResRep and DepGraph's sparse phase do), so that
  removing them costs little;
* :meth:`GradualPruning.finalize` rebuilds the dense smaller model with the
  surviving weights (checked against the plan like every rebuild); its outputs
  equal the masked model's (as the fit computes it, cut norms included).

The model is never rebuilt during ``fit``, so the optimizer (its momentum,
every variable it holds) keeps following the same variables, on every backend.
After ``end_step`` the masked model trains at its full cost, for nothing:
:meth:`GradualPruning.carry_optimizer` lets a second ``fit`` go on with the
finalized smaller model, its optimizer state sliced as its weights were.
Works with ``keras.distillation.Distiller``: the callback prunes its student.
"""

from __future__ import annotations

import math

import keras
import numpy as np

from keras_precrop._gradual_checks import SCHEDULES as SCHEDULES  # the schedules, re-exported
from keras_precrop._gradual_checks import (
    check_arguments,
    masked_norm_call,
    normalized_cuts,
    refuse_another_model,
    refuse_normalized_cuts,
    refuse_untrained_target,
    refuse_widening,
    reusable,
)
from keras_precrop.errors import NAME_ONLY, ArgumentError
from keras_precrop.graph.rebuild import rebuild
from keras_precrop.graph.walker import walk
from keras_precrop.plans import check_input_shapes, named_for, planned_widths
from keras_precrop.subject import at_sizes_of, probe_specs, with_inputs
from keras_precrop.training._user_data import check_data
from keras_precrop.training.constraints import LentFactors, distribution_scope, factors_in_step
from keras_precrop.transfer.carry import carried_indices, carry_weights, weight_values
from keras_precrop.transfer.criteria import Names
from keras_precrop.transfer.importance import channel_scores
from keras_precrop.transfer.optimizer_state import carry_optimizer_state
from keras_precrop.transfer.selection import select
from keras_precrop.transfer.taylor import data_batches
from keras_precrop.verify import build_checked

IMPORTANCE = Names("kp.GradualPruning")  # the rankings of the table that can rank during fit


def schedule_fraction(step, start_step, end_step, schedule="cubic"):
    """How far pruning has gone at optimizer step ``step``: 0 at ``start_step``, 1 from ``end_step``.

    ``"cubic"`` is Zhu & Gupta's ``1 - (1 - t)^3``: most channels go early,
    while the network is still close to the trained one, few near the end.
    ``"final"`` masks nothing before ``end_step`` and everything from it
    (with ``shrink``, the channels fade first and go at once at the end).
    """
    if end_step <= start_step or schedule == "final":
        return 1.0 if step >= end_step else 0.0
    t = min(max((step - start_step) / (end_step - start_step), 0.0), 1.0)
    return 1.0 - (1.0 - t) ** 3 if schedule == "cubic" else t


def widths_at(variables, targets, fraction):
    """Every width variable's width when pruning has gone ``fraction`` of the way to ``targets``.

    Rounded up to each variable's ``multiple``; a view or writer never
    exceeds its bound's width at the same fraction (both interpolate alike).
    """
    out = []
    for v, target in zip(variables, targets):
        width = v.width - fraction * (v.width - target)
        out.append(int(min(v.width, max(target, math.ceil(width / v.multiple - 1e-9) * v.multiple))))
    for i, v in enumerate(variables):
        if v.bound is not None and not v.fixed:  # a fixed width (a layer kept whole) stays
            out[i] = min(out[i], out[v.bound])
    return out


class GradualPruning(keras.callbacks.Callback):
    """Prune a model's channels gradually during ``fit``, towards a plan's widths.

    Example::

        plan = kp.plan(model, latency=0.5)                  # widths to reach
        steps = len(train_ds)                               # prune over epoch 1
        pruning = kp.GradualPruning(plan, end_step=steps)
        model.fit(train_ds, epochs=3, callbacks=[pruning])
        small = pruning.finalize()                          # the dense, smaller model

    Args:
        plan: a :class:`~keras_precrop.Plan` made for the model being
            trained (``kp.plan(model, latency=0.5)``). A plan, not budgets:
            it is made once, before ``fit``, so that a fit resumed in another
            process (a new callback) prunes to the same widths; a latency
            budget planned anew would be timed anew, and could differ.
            Checked when the first fit begins, as ``kp.apply_plan`` checks
            it (the model's architecture and input size, widths that grouped
            layers can split); a plan that widens a layer is refused (masks
            only remove channels: widen with ``kp.apply_plan``). A plan that
            cuts the channels a LayerNormalization or RMSNormalization
            normalizes over (a transformer's hidden width) is taken: during
            the fit they normalize over the kept channels (TensorFlow, or
            PyTorch without ``jit_compile``; refused under JAX); one that cuts
            a GroupNormalization's or a softmax's is refused, naming the layer
            and the ``ignore=`` that keeps its channels. A model
            built for any input size (``keras.Input((None, None, 3))``)
            takes plans under parameter budgets, which do not depend on it.
        end_step: the optimizer step (``optimizer.iterations`` of the model
            ``fit`` trains) at which the model reaches the plan's widths; the
            masks stay fixed afterwards. The count is the optimizer's, so a
            resumed fit goes on where it was; an optimizer that has counted
            past ``start_step`` on a model with nothing masked yet (loaded
            compiled, or fitted before) is refused, naming the steps to give.
        start_step: the step at which pruning (and ``shrink``) starts (0: at once).
        frequency: optimizer steps between two updates of the masks.
        schedule: ``"cubic"`` (default), ``"linear"`` or ``"final"``; see
            :func:`schedule_fraction`.
        importance: how channels are ranked at each update: ``"l1"`` or
            ``"l2"`` norm of the weights that write and read each channel,
            each layer's share normalized; ``"taylor"``: ``|activation x
            gradient|`` summed over the batches of ``data`` (taken anew at
            each update, at the weights reached); ``"bn_scale"``: the
            ``|gamma|`` of the normalization layers that write each channel;
            or any ranking of the table that needs no seed, by name or
            itself (see :func:`~keras_precrop.transfer.criteria.register_importance`).
        data: for a ranking that needs data (``"taylor"``) only: an ``(x, y)`` batch or an
            iterable of a few, from the training data (e.g.
            ``train_ds.take(4)``); each update costs a forward and backward
            pass over them. A list, ``tf.data.Dataset`` or ``DataLoader``
            is read anew at each update; a generator or other iterator,
            which can be read only once, is read when the first fit begins
            and its batches (at most 32; more are refused) are kept and
            ranked on at every update.
        regrow: ``False``: masked weights are zeroed after every optimizer
            step, so a channel once masked stays out. ``True``: zeroed at the
            updates only, so it may train back in between and be ranked in.
        shrink: between ``start_step`` and ``end_step``, the weights of the
            channels the plan's widths leave out (ranked at each update)
            are multiplied by ``1 - shrink`` after every optimizer step,
            so they fade before they are masked (0, the default: off;
            0.01 leaves 2% of a weight after 390 steps).
        model: the model to prune, which the fit must train (the fitted
            model, a part of it, or a ``Distiller`` whose student it is;
            refused otherwise); default: the model being fitted (the
            student of a ``keras.distillation.Distiller``). The callback is
            bound to the model it prunes at its first fit: later fits (of
            that model, or a ``Distiller`` around it) go on with its
            schedule; a fit of another model is refused (make a new callback).
        verbose: 1 prints a line at each update (widths reached, masked
            channels), 0 is silent.
    """

    def __init__(self, plan, end_step, *, start_step=0, frequency=50, schedule="cubic",
                 importance="l1", data=None, regrow=False, shrink=0.0, model=None, verbose=1):
        super().__init__()
        # the table's ranking of importance=, checked with the other arguments
        self._ranking = check_arguments(plan, end_step, start_step, frequency, schedule,
                                        (importance, data), regrow, shrink)
        self.plan, self.end_step, self.start_step = plan, int(end_step), int(start_step)
        self.frequency, self.schedule, self.importance = int(frequency), schedule, importance
        self.regrow, self.shrink, self.verbose, self._target = bool(regrow), float(shrink), verbose, model
        self._graph = self._targets = self._masks = self._selection = self._widths = None
        self._fraction, self._fading, self._plan, self._ranked = None, [], plan, False
        self._combined = self._on_host = ()
        self._each_step = {}  # id(weight): what the train step multiplies it by, since the last update
        self._updated_at = self._target_walk = self._final = self._bound = None
        self._data = data
        # the constraints that apply the masks inside the train step (see _hold_steps), the weights
        # they may mask, and the optimizer's count as far as the host knows it (see _next_read)
        self._lent, self._maskable, self._trained = LentFactors(), None, ()
        self._norms = ()  # (layer, keep, call) of each cut norm, its call lent with the factors
        self._upper = self._read_at = 0
        self._batch = -1

    @property
    def _fitted(self):
        """The model to prune or its ``Distiller``: the ``model=`` given, else the model ``fit`` trains.

        ``self.model`` is read either way: under JAX, reading it puts the
        training state back into the variables (else they are empty mid-fit).
        """
        fitted = self.model
        return self._target if self._target is not None else fitted

    @property
    def pruned(self):
        """The model whose channels are masked (the fitted model, or its student)."""
        return getattr(self._fitted, "student", self._fitted)

    def on_train_begin(self, logs=None):
        """Bind the callback to the model it prunes at its first fit, refusing before any step
        trains what a later step or ``finalize`` would refuse; at a later fit, check it is the
        same model (a callback's masks, schedule and ``finalize`` are one model's)."""
        if self._target is not None:  # every fit: the fitted model must train it
            refuse_untrained_target(self._target, self.pruned, self.model)
        if self._bound is not None and self.pruned is not self._bound:
            refuse_another_model(self._bound, self.pruned)
        if self._bound is None:
            model = self.pruned
            check_input_shapes(self.plan, model)  # as apply_plan does, before the fit, not after
            self._graph = walk(_at_defined_size(model), ignore=self.plan.ignore,
                               residual=self.plan.residual, attention=self.plan.attention)
            self._plan = named_for(self.plan, self._graph)  # another instance's plan, by place
            self._targets = planned_widths(self._graph, self._plan, model)
            refuse_widening(self._graph, self._targets)
            if self._ranking.needs == "data":  # the data fits the model, before any step trains
                self._data = reusable(check_data(model, self._data, "data",
                                                 labels=self._ranking.needs_labels).data)
            if self._ranking.covers is not None:  # its weights (bn_scale's scales) touch every cut
                channel_scores(self._graph, weight_values(model), self._ranking, widths=self._targets)
            self._bound = model
        refuse_normalized_cuts(self._graph, self._targets, self.model)  # every fit: its backend
        self._ranked, self._batch = False, -1

    def on_epoch_begin(self, epoch, logs=None):
        self._batch = -1  # batches count from 0 in every epoch

    def on_train_batch_begin(self, batch, logs=None):
        if not self._ranked:  # after every on_train_begin: BackupAndRestore's may restore the step
            self._ranked = True
            step = self._step()
            if self._updated_at is None:
                self._refuse_a_schedule_already_past(self._last_update(step))
            self._hold_steps(step)  # after every refusal: a fit refused keeps its own constraints
            self._update(self._last_update(step), force=True)
            self._upper, self._read_at = step, self._next_read(step)

    def on_train_batch_end(self, batch, logs=None):
        """Update the masks where an update point is reached or passed; else apply on the host what
        the train step does not (nothing, where the backend lets the step apply the masks).

        The optimizer's count is read only where an update may be due: each batch steps it once at
        most (``steps_per_execution > 1``: as many times as batches went by), so the count is at
        most the last one read plus the batches since; one found ahead is read at every batch on.
        """
        self._upper += batch - self._batch
        self._batch = batch
        if self._upper < self._read_at:
            self._apply(self._on_host)
            return
        step = self._step()
        self._upper = step if step <= self._upper else math.inf
        due = self._last_update(min(step, self.end_step)) if step >= self.start_step else None
        if due is not None and due != self._updated_at:  # an update point reached or passed
            self._update(due)
        else:
            self._apply(self._on_host)
        self._read_at = self._next_read(step)

    def on_train_end(self, logs=None):
        self._release_steps()

    def _next_read(self, step):
        """The first optimizer step after ``step`` (read, and acted on) at which an update may be due."""
        if step < self.start_step:
            return self.start_step
        if self._last_update(min(step + 1, self.end_step)) != self._updated_at:
            return step + 1  # a fit resumed past end_step ranks again at end_step
        if step >= self.end_step:
            return math.inf
        return min(self._last_update(step) + self.frequency, self.end_step)

    def _hold_steps(self, step):
        """Lend a :class:`StepFactor` to every weight the masks may cut that this fit trains, and to
        every cut LayerNormalization or RMSNormalization a call with its statistics over the kept
        channels (:func:`_lent_norm`), where the backend's train step applies them
        (:func:`factors_in_step`): the masks and the fading then need no host work between
        updates; else the host applies them after every batch (and a cut norm was refused).
        ``step``: the optimizer's count, read."""
        model = self.model
        self._trained = {id(v) for v in model.trainable_variables}
        if not factors_in_step(model):
            return
        if self._maskable is None:  # the weights any masks cut: those cut at the plan's widths
            self._maskable = [w for w, _ in _masked(self._graph, self._targets, "l1",
                                                    self._rebuilt(self._targets))[0]]
            self._norms = [_lent_norm(rec) for rec in normalized_cuts(self._graph, self._targets)]
        self._lent.hold(model, [w for w in self._maskable if id(w) in self._trained], step,
                        [(layer, call) for layer, _, call in self._norms])

    def _release_steps(self):
        """Give the weights their own constraints back and the norms their own calls, their keep
        vectors full (see :class:`LentFactors`)."""
        if self._lent.held or self._lent.calls:
            self._lent.release(self.model, self._step())
            self._set_keeps({})

    def _set_keeps(self, keeps):
        """Make ``keeps`` (``{id(layer): 0/1 per channel}``; all for a norm left out) the channels
        each lent norm computes its statistics over."""
        for layer, keep, _ in self._norms:
            keep.assign(keeps.get(id(layer), np.ones(keep.shape, np.float32)))

    def _last_update(self, step):
        """The last update at or before ``step``: a resumed fit ranks at the widths it had then.

        The masked channels are zero, so they rank last and the same channels
        stay masked; ranking at ``step``'s own widths would mask more, early.
        """
        if self.start_step < step < self.end_step:
            return step - (step - self.start_step) % self.frequency
        return step

    def _step(self):
        """The step count of the optimizer ``fit`` trains with: it survives ``BackupAndRestore``
        and resumes the schedule."""
        return int(keras.ops.convert_to_numpy(self.model.optimizer.iterations))

    def _refuse_a_schedule_already_past(self, step):
        """Refuse to start at an optimizer step that the schedule has passed, on an unmasked model.

        The schedule counts ``optimizer.iterations``. A model loaded compiled,
        or fitted before, brings its optimizer's count: its first update would
        mask at once what the schedule spreads over many steps. A fit resumed
        by ``BackupAndRestore`` brings a count too, but its model is masked as
        far as that step (its cut channels are zero), so it goes on. With
        ``regrow`` before ``end_step`` masked channels train back in between,
        so a resumed model cannot be told from a fresh one: not checked.
        """
        fraction = schedule_fraction(step, self.start_step, self.end_step, self.schedule)
        if step <= self.start_step or fraction == 0 or (self.regrow and step <= self.end_step):
            return
        widths = widths_at(self._graph.variables, self._targets, fraction)
        if widths == [v.width for v in self._graph.variables] or _has_zero_channels(self._graph):
            return
        span = self.end_step - self.start_step
        raise ArgumentError(
            f"GradualPruning: the optimizer's step count (optimizer.iterations) is already {step} "
            f"as pruning starts, so the schedule from {{start_step}} to end_step={self.end_step} "
            f"would mask {fraction:.0%} of the way to the plan at once, while no channel of the "
            "model is masked yet: its optimizer has trained before (a model loaded compiled, or "
            f"fitted earlier). Compile the model again to count from 0, or give "
            f"start_step={step}, end_step={step + span}.", start_step=self.start_step)

    def _update(self, step, force=False):
        """Re-rank the channels and mask as many as the schedule says at ``step``.

        ``force``: before any step of the fit (its first batch, or ``finalize``), so the masks and
        the fading are applied whole; else the step just trained has applied the factors in force
        until now where the train step applies them, and the new masks complete them.
        """
        fraction = schedule_fraction(step, self.start_step, self.end_step, self.schedule)
        fading = self.shrink > 0 and fraction < 1 and step >= self.start_step
        self._updated_at = step
        if not force and fraction == self._fraction and not (self.regrow or fading):
            self._apply(self._on_host)  # the masks stand: as at any other step
            return
        self._fraction = fraction
        self._widths = widths_at(self._graph.variables, self._targets, fraction)
        ranking = (self._ranking, data_batches(self.pruned, self._data)
                   if self._ranking.needs == "data" and (fraction > 0 or fading) else None)
        self._masks, self._selection, keeps = ([], None, {}) if fraction == 0 else _masked(
            self._graph, self._widths, ranking, self._rebuilt(self._widths), self._kept(),
            [layer for layer, _, _ in self._norms])
        if self._lent.calls:  # the norms' statistics over the channels these masks keep
            self._set_keeps(keeps)
        self._fading = []
        if fading:  # what the plan's widths leave out, ranked now, fades by 1 - shrink a step
            final = _masked(self._graph, self._targets, ranking, self._rebuilt(self._targets))[0]
            self._fading = [(w, 1.0 - self.shrink * (1.0 - m)) for w, m in final]
        self._apply(self._set_factors(step, force))
        if self.verbose:
            masked = sum(int(m.size - m.sum()) for _, m in self._masks)
            fading = sum(int((f < 1).sum()) for _, f in self._fading)
            print(f"GradualPruning: step {step}, {fraction:.0%} of the way to the plan, "
                  f"{masked:,} weights masked" + (f", {fading:,} fading" if fading else ""),
                  flush=True)

    def _kept(self):
        """The channels the next masks must keep within (``regrow=False``: a masked channel stays
        out): the last update's, or those not zero in a model this callback starts on masked (a
        resumed fit); ``None`` with ``regrow``. Read only where an update masks."""
        if self.regrow:
            return None
        return self._selection if self._selection is not None else _nonzero(self._graph)

    def _rebuilt(self, widths):
        """The model rebuilt at the plan's widths, made once: the fading ranks at them at every
        update, and so does ``regrow`` once they are reached. Other widths: None (built anew)."""
        if list(widths) != list(self._targets):
            return None
        if self._target_walk is None:
            self._target_walk = _rebuilt_walk(self._graph, self._targets)
        return self._target_walk

    def _set_factors(self, step, force):
        """What multiplies each weight from the update at ``step`` on, made once per update; returns
        what the update applies now.

        ``_combined``: the masks with the fading. After every step: the same, or with
        ``regrow=True`` before ``end_step`` the fading alone; set into the lent
        :class:`StepFactor` s (1 where nothing applies), and for the other weights kept on the
        device as tensors (``_on_host``, applied by the host after every batch; a frozen weight
        does not change, so only where it fades). The update applies ``_combined``; where the step
        just trained has applied the earlier factors (``force``: no step has), it completes them.
        """
        combined = {id(w): (w, m) for w, m in self._masks}
        for w, f in self._fading:
            combined[id(w)] = (w, f * combined[id(w)][1] if id(w) in combined else f)
        fading = {id(w): (w, f) for w, f in self._fading}
        each_step = combined if not self.regrow or step >= self.end_step else fading
        held = self._lent.held
        now = [(w, f) if force or key not in held else (w, _completion(self._each_step.get(key), f))
               for key, (w, f) in combined.items()]
        now += [(w, _completion(self._each_step[key], None)) for key, (w, _) in held.items()
                if not force and key in self._each_step and key not in combined]
        self._each_step = {key: f for key, (_, f) in each_step.items()}
        self._lent.set(self._each_step)
        self._combined = list(combined.values())
        self._on_host = [(w, keras.ops.convert_to_tensor(f, dtype=w.dtype))
                         for key, (w, f) in each_step.items()
                         if key not in held and (key in self._trained or key in fading)]
        return now

    def _apply(self, pairs):
        """Multiply each weight of ``pairs`` by its factor, from the host. Reading ``self.model``
        first puts JAX's training state into the variables (they are empty mid-fit)."""
        if pairs and self.model is not None:
            for variable, factor in pairs:
                variable.assign(variable * keras.ops.convert_to_tensor(factor, dtype=variable.dtype))

    def finalize(self):
        """The dense smaller model: the plan's widths, with the surviving channels' weights.

        Call it after ``fit`` has reached ``end_step``. The model is rebuilt
        from the walk made at the start of training, with the channels of the
        last update (the masks), and checked against the plan; its outputs
        equal the masked model's as the fit computed it (cut norms over their
        kept channels). A fit that trained no batch reaches
        ``end_step`` only where the optimizer's count is there already: with
        ``start_step == end_step`` equal to it (``end_step=0`` on a fresh
        optimizer: pruning in one shot) the model is masked now, ranked as
        the first batch would have; a model restored past ``end_step`` (a fit
        resumed by ``BackupAndRestore``) keeps the channels it had masked.
        A model built for any input size (``keras.Input((None, None, 3))``)
        gets a smaller model built for any size.

        Returns:
            A new ``keras.Model``; ``.precrop_plan`` holds the plan.

        Raises:
            ArgumentError: pruning has not reached the plan yet (naming the
                optimizer's step), or no batch trained and the masks ranked
                now would cut weights the model trained (it is not the masked
                model its step implies).
        """
        self._release_steps()  # where no on_train_end came (a fit raised): the weights' own constraints
        if self._graph is not None and self._fraction is None and self._step() >= self.end_step:
            self._update_unfitted()
        if self._graph is None or self._fraction != 1.0:
            reached = "not started: no fit has begun" if self._graph is None else (
                "not started: no batch has trained" if self._fraction is None else
                f"gone {self._fraction:.0%} of the way") + f" (the optimizer is at step {self._step()})"
            raise ArgumentError(f"GradualPruning.finalize: pruning has {reached}; fit the model "
                                "past {end_step} first.", end_step=self.end_step)
        self._apply(self._combined)
        new, rebuilt = build_checked(self._graph, self._targets, self._plan, build=self._build)
        carry_weights(self._graph, new, self._targets, new_graph=rebuilt, selection=self._selection)
        if self._graph.model is not self._bound:  # walked at a defined size: back to the model's own
            new, rebuilt = _at_open_size(new, self._bound, self._graph)
        new.precrop_plan = self._plan
        self._final = rebuilt
        return new

    def _build(self, graph, widths, seed=None):
        """The smaller model :meth:`finalize` fills with the kept weights: the graph rebuilt
        (``kp.hub.GradualPruning`` re-creates the keras_hub task from a config instead)."""
        return rebuild(graph, widths, seed=seed)

    def _update_unfitted(self):
        """Mask a model at or past ``end_step`` after fits that trained no batch.

        Where the schedule starts and ends at the optimizer's step, nothing was
        to train first: the masks are ranked now, as the first batch would have.
        Else the model must be one restored past ``end_step``, masked: ranked
        at the restored step, its zero channels last, and the masks must zero
        nothing it trained (a ranking that moved a residual stream's prefix
        would cut kept channels, so that is refused).
        """
        step = self._step()
        if step <= self.start_step:
            self._update(step, force=True)
            return
        before = {id(w): keras.ops.convert_to_numpy(w) for w in self._bound.weights}
        self._update(step, force=True)
        cut = [w.path for w, mask in self._masks if np.any(before[id(w)][mask == 0] != 0)]
        if cut:
            raise ArgumentError(
                f"GradualPruning.finalize: the model, restored at step {self._step()} (past "
                "{end_step}, no batch trained since), would lose trained weights of "
                f"{cut[:3]} to the masks ranked now, so it is not the masked model it was. "
                "Finalize with the callback that fitted it.", end_step=self.end_step)

    def carry_optimizer(self, model):
        """Give ``model``'s optimizer the state of the one ``fit`` used, to train on smaller.

        Once the masks are final the masked model trains at its full cost;
        the model :meth:`finalize` returns computes the same at the plan's
        cost. To go on training it where ``fit`` stopped, compile it (or a
        ``Distiller`` around it) with a fresh optimizer of the same class and
        call this: the optimizer is built on ``model``'s trainable variables
        and takes the fitted one's step count (a schedule goes on where it
        was) and its slots (momentum, Adam's moments, ...) sliced to the kept
        channels as the weights were, so every kept weight goes on exactly
        as it would have in the masked model (all but the queries of
        attention heads made narrower, ``attention="head_dims"``: the rebuild
        rescales them by ``sqrt(new / old key_dim)``, so their gradients and
        steps differ from the masked model's by that factor, and their slots
        are carried as the weights are)::

            small = pruning.finalize()
            small.compile(optimizer=keras.optimizers.SGD(schedule, momentum=0.9), loss=...)
            pruning.carry_optimizer(small)
            small.fit(train_ds, initial_epoch=1, epochs=10)

        Args:
            model: compiled, and training the model :meth:`finalize` returned
                (that model, or a ``keras.distillation.Distiller`` whose
                student it is).

        Raises:
            ArgumentError: ``finalize`` was not called, ``model`` does not
                train its result or is not compiled, or the optimizers'
                classes differ.
        """
        if self._final is None:
            raise ArgumentError("GradualPruning.carry_optimizer: call finalize() first; {model} "
                                "must train the model it returns.", model=NAME_ONLY)
        optimizer = getattr(model, "optimizer", None)
        ids = {id(v) for v in getattr(model, "trainable_variables", ())}
        if optimizer is None or not all(id(w) in ids for w in self._final.model.trainable_weights):
            raise ArgumentError("{model} must be compiled and train the model finalize() returned "
                                "(that model, or a Distiller whose student it is).", model=model)
        if not optimizer.built:
            optimizer.build(model.trainable_variables)
        carry_optimizer_state(self.model.optimizer, optimizer, self._graph, self._final,
                              self._targets, self._selection)


def channel_masks(graph, widths, importance="l1", rebuilt=None, kept=None):
    """0/1 masks of ``graph.model``'s weights that cut it to ``widths``, and the channels kept.

    Channels are ranked by ``importance`` on the current weights and chosen
    as ``apply_plan(..., weights="keep")`` would; the masks are found by
    carrying each weight's flat index through the rebuild at ``widths``, so
    a weight element is kept exactly when the rebuilt model would hold it.

    Args:
        graph: the walk of the model to mask.
        widths: the widths to cut it to, one per width variable.
        importance: a ranking that needs no data, by name (:data:`IMPORTANCE`)
            or itself, or ``(ranking, batches)`` for one that does
            (``"taylor"``, ``"activation"``): the batches of ``data=`` on the
            model (``transfer.taylor.data_batches``); a pair
            ``(ranking, None)`` is the ranking alone.
        rebuilt: :func:`_rebuilt_walk` of ``graph`` at ``widths``, made
            once by a caller that masks at the same widths again (building
            the model costs more than ranking its channels); default: built here.
        kept: the channels an earlier call kept (its selection, or those
            not zero), ranked above all others, so that none it masked comes
            back (a residual stream's order is shared by writers of several
            widths, and re-ranked freely it could hand a writer a channel it
            lost).

    Returns:
        ``([(variable, mask)], selection)``: the weights with at least one
        masked element, and the kept channels of every variable. The weights
        are the trainable ones and those of frozen layers (a frozen
        BatchNormalization's offset would feed a cut channel to a frozen
        reader); a trainable layer's non-trainable statistics are left
        alone: the masked scale and offset beside them zero the channel.

    Raises:
        ArgumentError: ``widths`` cut channels that a layer normalizes over:
            masks alone leave them in its statistics (``GradualPruning``
            computes a LayerNormalization's over the kept channels while it
            fits; see :func:`~keras_precrop._gradual_checks.refuse_normalized_cuts`).
    """
    refuse_normalized_cuts(graph, widths)
    return _masked(graph, widths, importance, rebuilt, kept)[:2]


def _masked(graph, widths, importance="l1", rebuilt=None, kept=None, norms=()):
    """:func:`channel_masks`' masks and selection, whatever norms the widths cut, and the channels
    each layer of ``norms`` keeps: ``{id(layer): 0/1 per channel of its input's last axis}``, read
    from its first weight's mask (a norm's weights follow the channels it normalizes over)."""
    model = graph.model
    name, gradients = importance if isinstance(importance, tuple) else (importance, None)
    scores = channel_scores(graph, weight_values(model), name, gradients, widths=widths)
    selection = select(graph, widths, scores if kept is None else _first(scores, kept))
    new_graph = _rebuilt_walk(graph, widths) if rebuilt is None else rebuilt
    frozen = {id(w) for rec in graph.layers if not getattr(rec.layer, "trainable", True)
              for w in rec.layer.weights}
    firsts = {id(layer.weights[0]): id(layer) for layer in norms}
    masks, keeps = [], {}
    for w, _, kept in carried_indices(graph, new_graph, widths, selection):
        mask = np.zeros(math.prod(w.shape), np.float32)
        kept = kept.ravel().astype(np.int64)
        mask[kept[kept > 0] - 1] = 1.0
        mask = mask.reshape(w.shape)
        if id(w) in firsts:
            keeps[firsts[id(w)]] = mask.reshape(-1, w.shape[-1]).max(axis=0)
        # a trainable layer's statistics are left alone: its masked scale zeroes them
        if (w.trainable or id(w) in frozen) and mask.min() == 0:
            masks.append((w, mask))
    return masks, selection, keeps


def _nonzero(graph):
    """The channels of every variable whose weights are not all zero: what an earlier callback
    kept, for a callback that starts on a masked model (a fit resumed by ``BackupAndRestore``)."""
    return {i: np.flatnonzero(score > 0)
            for i, score in channel_scores(graph, weight_values(graph.model), "l1").items()}


def _has_zero_channels(graph):
    """Whether some channel of ``graph.model`` is zero in every weight that writes or reads it."""
    return any(len(kept) < graph.variables[i].width for i, kept in _nonzero(graph).items())


def _first(scores, kept):
    """``scores`` raised so that the channels in ``kept`` rank above all others.

    Each variable adds a bonus larger than all scores together to the
    channels it kept; a residual stream's family sums its members' scores, so
    a channel kept by more members ranks higher, and every member's new
    prefix (no wider than before) falls within the channels it kept.
    """
    bonus = 1.0 + 2.0 * sum(float(np.abs(s).sum()) for s in scores.values())
    raised = {i: np.array(s, np.float64) for i, s in scores.items()}
    for i, channels in kept.items():
        if i in raised:
            raised[i][channels[channels >= 0]] += bonus
    return raised


def _rebuilt_walk(graph, widths):
    """The walk of ``graph.model`` rebuilt at ``widths``, through which :func:`channel_masks` carries
    each weight's index (the same layers ignored, the same residual rule)."""
    new = rebuild(graph, widths, timing=True)
    return walk(new, ignore=[rec.path for rec in graph.layers if rec.ignored], residual=graph.residual,
                attention=graph.attention)


def _lent_norm(rec):
    """``(layer, keep, call)``: the norm of ``rec``, a 0/1 variable of its channels (all kept, made
    beside its weights, mirrored alike under ``tf.distribute``), and the call lent to it for a
    fit (``Normalize.masked_call``), which reads ``keep`` as the train step reads the weights."""
    layer, masked = rec.layer, masked_norm_call(rec)
    with distribution_scope(layer.weights[0]):
        keep = keras.Variable(np.ones(layer.weights[0].shape[-1]), dtype="float32",
                              trainable=False, name="norm_keep")
    return layer, keep, lambda inputs: masked(inputs, keep)


def _completion(done, due):
    """The factor that turns a weight a step multiplied by ``done`` into the weight multiplied by
    ``due`` instead (``None``: 1): ``due / done``, exact where they are equal; where ``done`` is 0
    the weight is zero and stays so (an update's masks keep within the last ones)."""
    done, due = (np.float32(1.0) if f is None else f for f in (done, due))
    return np.where(done != 0, due / np.where(done != 0, done, 1), due).astype(np.float32)


def _at_defined_size(model):
    """``model``, or for a model built for any input size (``keras.Input((None, None, 3))``) one
    that calls ``model``'s own layers, so its weights are ``model``'s, at the size that plans give
    it (``subject.probe_specs``): what the walk reads.

    Parameters do not depend on the spatial size, so a plan under parameter budgets (the only
    budgets ``kp.plan`` takes for such a model) applies; its MACs are those at that size, as the
    plan's. The masks zero ``model``'s own weights.
    """
    specs = probe_specs(model, {})
    return model if specs is None else with_inputs(model, specs, share_layers=True)


def _at_open_size(new, model, graph):
    """``new``, rebuilt from ``graph`` (the walk of ``model`` at a defined size), as a model
    built for ``model``'s own open input size with ``new``'s weights, and its walk at the defined
    size (what ``carry_optimizer`` carries through): its layers are the returned model's own.
    A model at those sizes already (``kp.hub`` re-creates a task from its config) is itself."""
    opened = at_sizes_of(new, model)
    if opened is not new:
        opened.set_weights(new.get_weights())
    ignore = [rec.path for rec in graph.layers if rec.ignored]
    return opened, walk(_at_defined_size(opened), ignore=ignore, residual=graph.residual,
                        attention=graph.attention)


__all__ = ["GradualPruning", "channel_masks", "schedule_fraction", "widths_at"]
