"""Flower server side: the user-level DP strategy and the ServerApp."""
