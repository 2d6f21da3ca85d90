"""Tests of datamask.cli."""
