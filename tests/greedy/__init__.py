"""Tests of datamask.greedy."""
