"""What a run, a sweep or an audit reports: the run folder's metrics and progress line
(:mod:`~fedsim.reporting.metrics`), ``fedsim report`` (:mod:`~fedsim.reporting.report`), audit and
sweep reports (:mod:`~fedsim.reporting.audit_report`, :mod:`~fedsim.reporting.sweep_report`) and
experiment trackers (:mod:`~fedsim.reporting.tracking`).

Internal: these modules may move between releases; the stable surface is ``fedsim.__all__``.
"""
