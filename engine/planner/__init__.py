"""The what-if planner: a discrete-event model of the RL loop, fitted from a run.

    fit = fit_run_dir(run_dir)                      # engine.planner.fit
    table = plan_table(fit, cfg, devices=64)        # engine.planner.plan
    simulate(fit.inputs, placement, policy)         # engine.planner.model

Pure Python and numpy: no torch, no Ray (the control plane runs it in the web process).
"""

from engine.planner.fit import Fit, FitError, fit_run, fit_run_dir
from engine.planner.inputs import LengthModel, PlanInputs, load_inputs
from engine.planner.model import Prediction, Shape, shape_of, simulate
from engine.planner.plan import PlanTable, format_table, plan, plan_table, shapes_for

__all__ = ["Fit", "FitError", "LengthModel", "PlanInputs", "PlanTable", "Prediction",
           "Shape", "plan_table", "fit_run", "fit_run_dir", "format_table", "load_inputs",
           "plan", "shape_of", "shapes_for", "simulate"]
