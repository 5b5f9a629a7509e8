"""The server side: from the clipped replies to the next global model.

- :mod:`~fedsim.server.step.sampling`: which users train in a round (the participation scheme);
- :mod:`~fedsim.server.step.aggregation`: screening and clipping the replies, and their sum;
- :mod:`~fedsim.server.step.step`: the DP step (noise row, the fixed denominator ``K̄``, the filter,
  the server optimizer, the ledger);
- :mod:`~fedsim.server.step.filters`: DiSK and DOPPLER filters of the noisy aggregate;
- :mod:`~fedsim.server.step.optim`: server optimizers (FedAvgM, Adam, DP-AdamBC, LP-Adam, …).

Internal: these modules may move between releases; the stable surface is ``fedsim.__all__``.
"""
