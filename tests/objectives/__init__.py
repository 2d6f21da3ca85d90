"""Tests of datamask.objectives."""
