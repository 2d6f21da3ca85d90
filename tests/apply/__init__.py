"""Tests of datamask.apply."""
