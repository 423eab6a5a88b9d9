"""solve_widths on real models: exact budgets and the best proxy value.

The width program is the exact optimum of the SynExp proxy over channel
widths, so its objective must be at least that of the paper's sqrt(p)
translation of ``solve_densities`` at the same (realized) budget.
"""

import numpy as np
import pytest

import keras_precrop as kp


def _paper_widths_at_budget(prof, budget):
    """Continuous sqrt(p) widths whose realized params equal ``budget``.

    The density program's params budget is scaled by bisection until the
    realized cost of the sqrt(p) widths meets ``budget`` (it grows with it).
    """
    cm = prof.cost
    per_layer = cm.per_layer(cm.widths)
    layers = np.unique(cm.obj_layer)
    alpha = per_layer[layers, 0]
    rest = per_layer[:, 0].sum() - alpha.sum()
    producer = {}
    for k, i in enumerate(layers):
        for v in prof.graph.produced_variables(prof.graph.layers[i]):
            producer.setdefault(v, k)

    def widths(scale):
        p = kp.solve_densities(alpha, params_budget=scale * budget - rest).densities
        w = cm.widths.copy()
        for v, k in producer.items():
            if not cm.fixed[v]:
                w[v] = np.sqrt(p[k]) * cm.widths[v]
        return w

    lo, hi = (rest / budget) * 1.0001, 1.0
    for _ in range(60):
        mid = 0.5 * (lo + hi)
        lo, hi = (mid, hi) if cm.totals(widths(mid))[0] <= budget else (lo, mid)
    return widths(lo)


@pytest.mark.parametrize("name", ["resnet20", "mobilenet_v2_cifar"])
@pytest.mark.parametrize("ratio", [0.3, 0.6])
def test_solve_widths_meets_budget_and_beats_paper_mapping(name, ratio):
    prof = kp.profile(kp.models.get(name))
    cm = prof.cost
    problem, upper = prof.width_problem(upper=1.0)
    budget = ratio * prof.total_params
    res = kp.solve_widths(problem, params_budget=budget, upper=upper)
    assert res.success
    widths = cm.widths.copy()
    widths[~cm.fixed] = res.widths
    params, macs = cm.totals(widths)  # independent evaluation of the same cost model
    assert params == pytest.approx(budget, rel=1e-6)
    assert res.params == pytest.approx(params, rel=1e-9)
    assert np.all(widths <= cm.widths * (1 + 1e-9))
    paper = _paper_widths_at_budget(prof, budget)
    assert cm.totals(paper)[0] <= budget * (1 + 1e-9)
    assert cm.objective(widths) >= cm.objective(paper) - 1e-9
    assert res.objective == pytest.approx(cm.objective(widths), abs=1e-9)


def test_solve_widths_flops_budget_on_mobilenet():
    prof = kp.profile(kp.models.get("mobilenet_v2_cifar"))
    problem, upper = prof.width_problem(upper=1.0)
    res = kp.solve_widths(problem, flops_budget=0.5 * prof.total_macs, upper=upper)
    assert res.flops == pytest.approx(0.5 * prof.total_macs, rel=1e-6)
