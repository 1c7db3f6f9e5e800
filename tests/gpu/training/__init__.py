"""Training cases: the loop against the whole model step by step, sharded checkpoints across world sizes,
users' own loops (accelerate, Trainer) and the one-device tier."""
