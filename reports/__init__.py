"""Report templates shipped with harness (package data: harness._reports)."""
