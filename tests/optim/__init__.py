"""Tests of datamask.optim."""
