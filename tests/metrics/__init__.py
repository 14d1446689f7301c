"""Tests for live GPU metrics."""
