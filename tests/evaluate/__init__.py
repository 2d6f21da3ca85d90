"""Tests of datamask.evaluate."""
