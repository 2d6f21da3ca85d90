"""Tests of datamask.evaluation and the evaluate, report and bench doors."""
