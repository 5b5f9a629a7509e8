"""The client side: what a worker or a SuperNode computes for one user.

- :mod:`~fedsim.training.local.local`: one user's local update ``Δ_i = x_local − x_t``, clipped, and a
  worker's pass over many users;
- :mod:`~fedsim.training.local.vectorized` and :mod:`~fedsim.training.local.step_graphs`: many users' local
  SGD at once (``torch.func``) and captured step graphs;
- :mod:`~fedsim.training.local.example_dp`: example-level DP-SGD inside one user's update;
- :mod:`~fedsim.training.local.error_feedback`: client-side error feedback (DiceSGD's client mode);
- :mod:`~fedsim.training.local.local_updates`: the hook for a user's own local update;
- :mod:`~fedsim.training.local.scheduling` and :mod:`~fedsim.training.local.allocator`: which worker trains
  which users, and the training processes' allocator settings.

Internal: these modules may move between releases; the stable surface is ``fedsim.__all__``.
"""
