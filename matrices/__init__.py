"""Matrices shipped with harness (package data: harness._matrices). A repository's own matrices/ adds to these."""
