"""Empirical privacy attacks and the statistics that turn their scores into reported numbers:
secret-sharer exposure (Carlini et al. 2019), membership/user-inference ROC metrics with bootstrap
intervals, and Clopper–Pearson ε lower bounds for auditing (Jagielski et al. 2020, Nasr et al. 2021).
See :mod:`fedsim.attacks.stats`."""

from fedsim.attacks.stats import (
    BootstrapInterval,
    EpsilonLowerBound,
    ExposureEstimate,
    bootstrap_ci,
    clopper_pearson,
    epsilon_lower_bound,
    epsilon_lower_bound_from_scores,
    exposure,
    extrapolated_exposure,
    rank,
    roc_auc,
    roc_curve,
    skewnorm_logcdf,
    tpr_at_fpr,
)

__all__ = [
    "BootstrapInterval",
    "EpsilonLowerBound",
    "ExposureEstimate",
    "bootstrap_ci",
    "clopper_pearson",
    "epsilon_lower_bound",
    "epsilon_lower_bound_from_scores",
    "exposure",
    "extrapolated_exposure",
    "rank",
    "roc_auc",
    "roc_curve",
    "skewnorm_logcdf",
    "tpr_at_fpr",
]
