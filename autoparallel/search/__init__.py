"""Search: enumerate layouts, apply the rules, rank the survivors (and Optuna studies)."""

from .plan import PlanResult, plan
from .space import SearchSpace, load_space

__all__ = ["PlanResult", "SearchSpace", "load_space", "plan"]
