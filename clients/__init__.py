"""Flower client side: the fedsim ClientApp."""
