"""The families under test: the registry read from transformers by introspection, its overrides, tiny
checkpoints with routing by construction, config switches and each family's EP history."""
