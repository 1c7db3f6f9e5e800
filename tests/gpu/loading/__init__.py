"""How the suite loads a model: the one adapter that knows each transformers release's API for a layout,
and the float64 reference."""
