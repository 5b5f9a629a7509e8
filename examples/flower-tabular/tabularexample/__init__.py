"""tabularexample: Flower's fl-tabular app, with fedsim's user-level DP."""
