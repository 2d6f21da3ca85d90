"""Optimisers: the DATAMASK mask learner."""

from .mask_learner import ESTIMATORS, INITS, MaskLearner, top_k_rows

__all__ = ["ESTIMATORS", "INITS", "MaskLearner", "top_k_rows"]
