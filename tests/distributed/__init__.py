"""Tests of datamask.distributed."""
