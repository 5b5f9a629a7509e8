"""advancedexample: Flower's advanced-pytorch app, with fedsim's user-level MF-DP."""
