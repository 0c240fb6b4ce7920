"""Test and benchmark infrastructure (never imported by the product package)."""
