"""Tests of datamask.integrations."""
