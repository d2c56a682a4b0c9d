"""How draft heads learn from a frozen target: data, features, losses and the training loop."""
